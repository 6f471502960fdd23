"""deploy/k8s against the real server: every metric name and label that the autoscaling rules (prometheus-adapter's
config, deploy/k8s/prometheus-adapter) and the Grafana dashboard query is served by the metrics endpoint (the
OpenAI frontend's by its /metrics), leaving out only the labels Prometheus adds at the scrape; the pods' HTTP
probes answer 200 on a ready server; and the OpenAI frontend started as the Kubernetes manifests start it (Triton
through `dns:///HOST:PORT`, round_robin) serves."""
from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx2 as httpx
import pytest
import yaml

import k8s_manifests as k8s
from ragstack.launcher import free_port

pytestmark = pytest.mark.server
HAS_GPU = Path("/proc/driver/nvidia/version").exists()   # nv_gpu_* exist only where the server sees a GPU


def source(kind: str) -> list[dict]:
    return [o for objects in k8s.source_objects().values() for o in objects if o["kind"] == kind]


def samples(metrics_url: str) -> dict[str, list[set[str]]]:
    """Metric name -> the label names of each of its samples."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    out: dict[str, list[set[str]]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.partition("{")
            name = name.split(" ")[0]
            labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', rest.split("}")[0])) if rest else set()
            out.setdefault(name, []).append(labels)
    return out


def missing(expressions: list[str], served: dict[str, list[set[str]]]) -> list[str]:
    """What the expressions name that the endpoint lacks: a metric, or a label on no sample of a metric."""
    problems = []
    for expr in expressions:
        names = k8s.promql_metrics(expr)
        assert names, f"no metric name read in {expr!r}"
        labels = k8s.promql_labels(expr) - k8s.SCRAPE_LABELS
        for name in names:
            if name.startswith("nv_gpu_") and not HAS_GPU:
                continue
            if name not in served:
                problems.append(f"{name} is not served ({expr})")
                continue
            for label in labels:
                if not any(label in sample for sample in served[name]):
                    problems.append(f"{name} has no label {label!r} ({expr})")
    return problems


def adapter_expressions() -> list[str]:
    [configmap] = [o for o in source("ConfigMap") if o["metadata"]["name"] == "prometheus-adapter-ragstack"]
    return k8s.adapter_expressions(yaml.safe_load(configmap["data"]["config.yaml"])["rules"])


def test_every_metric_and_label_the_autoscaling_rules_query_is_served(triton_server):
    expressions = adapter_expressions()
    assert len(expressions) >= 6
    # The llm's gauges exist once it is loaded (the session server loads every model).
    assert missing(expressions, samples(triton_server.metrics_url)) == []


def test_every_metric_and_label_the_dashboard_queries_is_served(triton_server):
    """Triton's and the llm's at :8002; the OpenAI frontend's at its /metrics, once it has answered (a labelled
    series appears with its first request): a streamed chat and a refusal."""
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0)
    for _ in client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                            stream=True):
        pass
    with pytest.raises(NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    expressions = k8s.dashboard_expressions()
    frontend = [e for e in expressions if "ragstack_openai_" in e]
    server = [e for e in expressions if e not in frontend]
    assert frontend and server
    assert missing(server, samples(triton_server.metrics_url)) == []
    assert missing(frontend, samples(f"{triton_server.openai_url}/metrics")) == []


def test_the_pods_http_probes_answer_on_a_ready_server(triton_server):
    """Each httpGet probe of the Deployments, on the port it names: the gateway's (Triton's readiness through
    it, /readyz, /livez) and the OpenAI frontend's (/health)."""
    here = {8000: f"http://{triton_server.http_url}", 9000: triton_server.openai_url}
    probed = set()
    for deployment in source("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                get = container.get(kind, {}).get("httpGet")
                if get:
                    url = f"{here[get['port']]}{get['path']}"
                    assert httpx.get(url, timeout=10).status_code == 200, (container["name"], kind, url)
                    probed.add(get["path"])
    assert probed == {"/v2/health/ready", "/readyz", "/livez", "/health"}


def test_the_openai_frontend_started_as_kubernetes_starts_it_serves(triton_server, tmp_path):
    """`--triton dns:///HOST:PORT` (the headless Service there, this server's gRPC here) with round_robin."""
    [deployment] = [d for d in source("Deployment") if d["metadata"]["name"] == "ragstack-openai"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    port = free_port()
    grpc_port = triton_server.grpc_url.rsplit(":", 1)[1]
    args = [sys.executable, *args[1:]]
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    args[args.index("--triton") + 1] = f"dns:///127.0.0.1:{grpc_port}"
    log = tmp_path / "openai.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        answer = httpx.post(f"{url}/v1/completions", json={"model": "llm", "prompt": "hello", "max_tokens": 3},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
    finally:
        process.terminate()
        process.wait(timeout=60)
