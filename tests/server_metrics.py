"""Reading the server's Prometheus metrics (:8002) in tests: one value per model, summed over
versions unless one is named, and waiting for a gauge (the llm's gauges are refreshed every metrics_interval_s, 0.25 s)."""
from __future__ import annotations

import time
import urllib.request


def metric_value(url: str, name: str, model: str = "llm", version: str | None = None) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name) and f'model="{model}"' in line and not line.startswith(name + "_bucket") \
                and (version is None or f'version="{version}"' in line):
            head = line.split("{")[0]
            if head == name:
                total += float(line.rsplit(" ", 1)[1])
                found = True
    assert found, f"{name} missing from metrics"
    return total


def wait_for_metric(url: str, name: str, model: str, wanted, timeout_s: float = 20.0) -> float:
    """Polls until `wanted(value)` holds; returns the value, or fails with the last one seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = metric_value(url, name, model)
        if wanted(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{{model={model}}} = {value} after {timeout_s} s")
        time.sleep(0.05)


def pending_requests(url: str) -> dict[str, float]:
    """Model -> requests Triton holds in its queues (nv_inference_pending_request_count), the nonzero
    ones: where requests that never ended are stuck."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    pending: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{"):
            model = line.split('model="', 1)[1].split('"', 1)[0]
            pending[model] = pending.get(model, 0.0) + float(line.rsplit(" ", 1)[1])
    return {model: count for model, count in pending.items() if count}
