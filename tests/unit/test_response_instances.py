"""How the llm's instances share an engine (backends/triton_llm/response_instances.py), without a server:
the instances on one device as Triton's normalized config lists them, `engine_process: false` refusing
several, and the name of the engine: one per server, model, version, device and configuration."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from response_instances import check_thread_engine, engine_share, instances_on_device  # noqa: E402

from llm_engine.engine.engine_share import EngineShare, run_directory  # noqa: E402


@pytest.mark.parametrize("groups, kind, device, expected", [
    ([{"kind": "KIND_MODEL", "count": 4}], "MODEL", 0, 4),
    ([{"kind": "KIND_CPU", "count": 2}], "CPU", 0, 2),
    ([{"kind": "KIND_GPU", "count": 4, "gpus": [0, 1]}], "GPU", 1, 4),       # count instances on each GPU
    ([{"kind": "KIND_GPU", "count": 2, "gpus": [0]}, {"kind": "KIND_GPU", "count": 3, "gpus": [1]}], "GPU", 1, 3),
    ([{"kind": "KIND_GPU", "count": 2, "gpus": [0]}, {"kind": "KIND_GPU", "count": 3, "gpus": [0, 1]}], "GPU", 0, 5),
    ([], "MODEL", 0, 1),
])
def test_instances_on_a_device(groups, kind, device, expected):
    assert instances_on_device({"instance_group": groups}, kind, device) == expected


def test_an_engine_in_the_stub_takes_one_instance():
    check_thread_engine(1)
    with pytest.raises(ValueError, match=r"engine_process false runs the engine in the stub.*not 3"):
        check_thread_engine(3)


class Config:
    def __init__(self, device: str, **settings):
        self.device, self.settings = device, settings

    def __repr__(self) -> str:
        return f"EngineConfig(device={self.device!r}, {self.settings})"


def test_the_engine_is_named_by_model_version_device_and_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_ENGINE_RUN_DIR", str(tmp_path / "run"))
    model_config = {"name": "llm", "parameters": {"max_model_len": {"string_value": "2048"}}}
    share = engine_share("llm", "1", model_config, Config("cuda:0"), 4)
    assert share.max_clients == 4 and share.directory == tmp_path / "run"
    assert share.label[:4] == ("--model", "llm/1", "--device", "cuda:0")
    assert len(share.socket_path.name) < 40  # the default directory, /tmp/llm-engine-<uid>, leaves room
    same = engine_share("llm", "1", model_config, Config("cuda:0"), 4)
    assert same.key == share.key
    others = [engine_share("llm", "2", model_config, Config("cuda:0"), 4),
              engine_share("llm", "1", model_config, Config("cuda:1"), 4),
              engine_share("llm", "1", {**model_config, "parameters": {}}, Config("cuda:0"), 4),
              engine_share("llm", "1", model_config, Config("cuda:0", dtype="float16"), 4),
              engine_share("other", "1", model_config, Config("cuda:0"), 4)]
    assert len({share.key, *(o.key for o in others)}) == 6


def test_the_run_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_ENGINE_RUN_DIR", str(tmp_path / "run"))
    assert (run_directory().stat().st_mode & 0o777) == 0o700
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    monkeypatch.setenv("LLM_ENGINE_RUN_DIR", str(tmp_path / "open"))
    with pytest.raises(PermissionError, match="not a private directory"):
        run_directory()
    share = EngineShare.named({"x": 1}, 2, directory=tmp_path)
    with share.locked():
        assert share.lock_path.exists()
    with pytest.raises(ValueError, match="longer than a Unix socket's path may be"):
        EngineShare.named({"x": 1}, 2, directory=tmp_path / ("d" * 100))


def test_the_gpu_config_is_the_llms_with_eight_instances():
    """docker-compose loads model_repository/llm/configs/gpu.pbtxt (--model-config-name=gpu): config.pbtxt's,
    but for the instance count (and the header saying so)."""
    folder = Path(__file__).resolve().parents[2] / "model_repository" / "llm"

    def settings(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]

    default, gpu = settings(folder / "config.pbtxt"), settings(folder / "configs" / "gpu.pbtxt")
    differ = [(a, b) for a, b in zip(default, gpu) if a != b]
    assert len(default) == len(gpu) and differ == [("instance_group [ { kind: KIND_MODEL, count: 1 } ]",
                                                    "instance_group [ { kind: KIND_MODEL, count: 8 } ]")]
