"""docker-compose.yml is valid: `docker compose config` where the plugin runs, else parsed and
every referenced path, port and service checked."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ragstack import admin_key

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def _compose_plugin_runs() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_docker_compose_config_validates():
    if not _compose_plugin_runs():
        pytest.skip("the docker compose plugin is not installed here; the parsed checks below cover the file")
    result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                            text=True, env={"RAGSTACK_ADMIN_KEY": "test", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr


def test_services_and_ports(compose):
    services = compose["services"]
    assert set(services) == {"triton", "prometheus", "grafana"}
    triton = services["triton"]
    ports = {p.rsplit(":", 1)[-1] for p in triton["ports"]}
    assert ports == {"8000", "8001", "8002"}
    # Only the inference ports face the network; metrics, prometheus and grafana stay on loopback.
    for port in triton["ports"]:
        if port.endswith("8002"):
            assert port.startswith("127.0.0.1:")
    for name in ("prometheus", "grafana"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])
    assert triton["image"] and triton["build"]["dockerfile"]
    assert triton["healthcheck"]["test"][-1].endswith("/v2/health/ready")
    assert triton["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert triton["restart"] and triton["shm_size"]


def test_triton_command_uses_both_repositories_and_restricted_api(compose):
    command = compose["services"]["triton"]["command"]
    assert "--model-repository=/models/model_repository" in command
    assert "--model-repository=/models/ensembles" in command
    assert "--model-control-mode=explicit" in command
    # The same restriction as `ragstack serve` with the key set, the key from the environment.
    expected = [arg.replace("=" + "k" * 16, "=${RAGSTACK_ADMIN_KEY:?set RAGSTACK_ADMIN_KEY}")
                for arg in admin_key.server_args("k" * 16)]
    assert [c for c in command if "restricted" in c] == expected
    assert all(v.endswith(":ro") for v in compose["services"]["triton"]["volumes"] if v.startswith("./"))


def test_every_referenced_path_exists(compose):
    triton = compose["services"]["triton"]
    assert (ROOT / triton["build"]["context"] / triton["build"]["dockerfile"]).is_file()
    named = set(compose.get("volumes", {}))
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{source} is mounted but missing"
            else:
                assert source in named, f"named volume {source} is not declared"
    # Project backends mounted into the image's backend directory must exist as backends.
    for volume in triton["volumes"]:
        source, target = volume.split(":")[:2]
        if target.startswith("/opt/tritonserver/backends/"):
            assert (ROOT / source / "model.py").is_file()
            assert not target.endswith("/onnxruntime"), "the image's native onnxruntime backend must serve ONNX"
    mounted = {v.split(":")[1].rsplit("/", 1)[-1] for v in triton["volumes"]
               if v.split(":")[1].startswith("/opt/tritonserver/backends/")}
    project = {p.name for p in (ROOT / "backends").iterdir() if (p / "model.py").is_file()}
    assert mounted == project - {"onnxruntime"}, "every project backend but onnxruntime is mounted"


def test_prometheus_scrapes_triton_metrics_and_dashboard_parses():
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = prom["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["triton:8002"]
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "triton.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert "nv_inference_request_success" in exprs and "nv_gpu_utilization" in exprs
