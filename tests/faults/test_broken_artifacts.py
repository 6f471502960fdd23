"""A malformed or missing artifact fails that model's load, through the repository API in explicit
mode, with a reason that names the file; the other models keep serving. Each broken model is a
copy of a project config in a temporary repository of its own server (the project's repositories
are never touched), next to the healthy `echo`.

Found here (Triton 2.51): with strict readiness, which the launcher sets, a failed load leaves the
server not-ready (/v2/health/ready) although every loaded model serves, until that model loads; an
unload does not clear it. (A config.pbtxt that does not parse is Triton's to report, in its log: the
launcher's start shows those lines, test_launcher.py.)
"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ragstack.launcher import ROOT, TritonServer
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server
PROJECT = ROOT / "model_repository"


def copy_config(repo, source: str, name: str, files=()):
    """repo/name: source's config renamed, with `files` copied from source's version 1."""
    (repo / name / "1").mkdir(parents=True)
    text = (PROJECT / source / "config.pbtxt").read_text()
    (repo / name / "config.pbtxt").write_text(re.sub(r'^name: ".*"', f'name: "{name}"', text, flags=re.M))
    for file in files:
        shutil.copy(PROJECT / source / "1" / file, repo / name / "1" / file)
    return repo / name / "1"


def build_broken_models(repo):
    copy_config(repo, "embedder", "corrupt_onnx").joinpath("model.onnx").write_bytes(b"\x08\x07not a graph" * 64)
    copy_config(repo, "embedder", "missing_onnx")
    copy_config(repo, "retriever", "missing_index", ["manifest.json", "passages.jsonl"])
    truncated = copy_config(repo, "retriever", "truncated_index", ["manifest.json", "passages.jsonl"])
    truncated.joinpath("index.faiss").write_bytes((PROJECT / "retriever" / "1" / "index.faiss").read_bytes()[:200])
    copy_config(repo, "llm", "missing_checkpoint")  # its `model` parameter names 1/tiny-qwen2, not copied
    # The engine process fails to start (its KV pool cannot be allocated): the load quotes its traceback.
    copy_config(repo, "llm", "engine_fails").joinpath("engine.json").write_text(json.dumps(
        {"model": str(PROJECT / "llm" / "1" / "tiny-qwen2"), "device": "cpu", "num_kv_blocks": 10**9}))


BROKEN = [
    # model, what the load error must say
    ("corrupt_onnx", [r"corrupt_onnx/1/model\.onnx", "Protobuf parsing failed"]),
    ("missing_onnx", [r"missing_onnx/1/model\.onnx", "File doesn't exist"]),
    ("missing_index", [r"index\.faiss is missing from .*missing_index/1", "ragstack index build"]),
    ("truncated_index", [r"index\.faiss in .*truncated_index/1 cannot be read \(.*read error", "ragstack index build"]),
    ("missing_checkpoint", [r"model 'tiny-qwen2': no folder .*missing_checkpoint/1/tiny-qwen2\. Name a local "
                            r"Hugging Face folder", r"nothing is downloaded"]),
    ("engine_fails", [r"the engine process exited with code 1 while starting; its last output:",
                      r"Traceback", r"num_kv_blocks 1000000000 x block_size 16 exceeds \d+ cache slots"]),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("broken-repository")
    shutil.copytree(FIXTURE_REPOSITORY / "echo", path / "echo")
    build_broken_models(path)
    return path


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    options = free_server_options(model_repositories=[repo], models=["echo"])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-broken")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def echo(client) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[7.0]], dtype=np.float32))
    return client.infer("echo", [tensor]).as_numpy("OUTPUT")


@pytest.mark.parametrize("model, reasons", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_artifact_fails_its_load_with_the_reason(server, client, model, reasons):
    with pytest.raises(InferenceServerException) as info:
        client.load_model(model)
    for reason in reasons:
        assert re.search(reason, info.value.message()), info.value.message()
    assert not client.is_model_ready(model)
    assert client.is_server_live()
    np.testing.assert_array_equal(echo(client), [[7.0]])  # the others keep serving


def test_a_repaired_artifact_loads(repo, client):
    with pytest.raises(InferenceServerException):
        client.load_model("corrupt_onnx")
    assert not client.is_server_ready()  # strict readiness: one failed model is enough
    shutil.copy(PROJECT / "embedder" / "1" / "model.onnx", repo / "corrupt_onnx" / "1" / "model.onnx")
    client.load_model("corrupt_onnx")
    assert client.is_model_ready("corrupt_onnx")
    client.unload_model("corrupt_onnx")
