"""The deployment files against the real server (docker compose itself cannot run here; the parsed
checks are in tests/unit/test_docker_compose.py): every metric the Grafana dashboard queries is
served by the metrics endpoint (the OpenAI frontend's by its own /metrics), and docker-compose's
healthchecks (Triton's readiness, the gateway's /livez, the OpenAI frontend's /health) pass on a ready
server."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from ragstack.launcher import ROOT

pytestmark = pytest.mark.server
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton.json"
# A metric name in a PromQL expression: Triton's families, ours, vllm_backend's and the OpenAI frontend's.
METRIC = re.compile(r"\b(?:nv_|triton_llm_|vllm:|ragstack_openai_)[a-z_:]+")
FRONTEND = "ragstack_openai_"


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found = METRIC.findall(target["expr"])
            assert found, f"no metric name read in {target['expr']!r}"
            names.update(found)
    return names


def served_families(metrics_url: str) -> dict[str, str]:
    """Metric name -> one of its sample lines."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return {line.split("{")[0].split(" ")[0]: line for line in reversed(text.splitlines())
            if line and not line.startswith("#")}


def test_every_metric_the_dashboard_queries_is_served(triton_server):
    queried = {name for name in dashboard_metrics() if not name.startswith(FRONTEND)}
    # nv_gpu_* exist only where the server sees a GPU; the tests run the CPU build of the server.
    gpu = Path("/proc/driver/nvidia/version").exists()
    wanted = {name for name in queried if gpu or not name.startswith("nv_gpu_")}
    served = served_families(triton_server.metrics_url)
    assert sorted(wanted - set(served)) == []
    # The panels sum by model: the per-model families carry the label.
    for name in wanted:
        if name.startswith("nv_inference_"):
            assert 'model="' in served[name], served[name]


@pytest.mark.parametrize("service", ["triton", "gateway", "openai"])
def test_the_compose_healthchecks_pass_on_a_ready_server(triton_server, service):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    kind, *command = compose["services"][service]["healthcheck"]["test"]
    assert kind == "CMD"
    if shutil.which(command[0]) is None:
        pytest.skip(f"{command[0]} is not installed here")
    # Inside each container its HTTP port is Triton's default: Triton's own, and the gateway's in front;
    # the OpenAI frontend's is its default.
    urls = {"triton": ("localhost:8000", triton_server.triton_http_url),
            "gateway": ("localhost:8000", triton_server.http_url),
            "openai": ("http://localhost:9000", triton_server.openai_url)}
    here = [arg.replace(*urls[service]) for arg in command]
    assert here != command, command
    result = subprocess.run(here, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, (here, result.stderr)


def test_every_frontend_metric_the_dashboard_queries_is_served(triton_server):
    """The OpenAI frontend's series appear once it has answered: a streamed chat and a refusal."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0)
    for _ in client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                            stream=True):
        pass
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    queried = {name for name in dashboard_metrics() if name.startswith(FRONTEND)}
    served = served_families(f"{triton_server.openai_url}/metrics")
    assert queried and sorted(queried - set(served)) == []
