"""On a server of its own with the llm and an admin key: a client that goes away ends its generation
through the gateway, and /livez tells a server that answers from one that does not.

Triton 2.51 cancels an HTTP request when it sees the connection close, and it looks only once the
request's first response is out (libevhtp pauses the connection until then): a streamed generation
(`"stream": true`, through generate or generate_stream alike) ends within a second, one that answers
once ran to max_tokens for nobody. The gateway closes its connection to Triton as soon as its
client's closes, which ends the first; for the second it has the llm abort the request by its cancel
key (ragstack.gateway.generate_body). Directly against Triton the second still runs on.
"""
from __future__ import annotations

import json
import time

import pytest
from ragstack.gateway.limits import GatewayLimits
from ragstack.launcher import DEFAULT_REPOSITORIES, TritonServer
from raw_http import connect, exchange, request_bytes
from server_helpers import free_server_options, stopped, wait_until
from server_metrics import metric_value, wait_for_metric

pytestmark = pytest.mark.server
KEY = "0123456789abcdef0123456789abcdef"
RUNNING = "triton_llm_num_requests_running"
COUNT = 4  # together they run for about 10 s on 2 CPU cores
LONG = {"text_input": "a long one", "parameters": {"max_tokens": 2000, "ignore_eos": True}}
LIVEZ_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    options = free_server_options(model_repositories=list(DEFAULT_REPOSITORIES), models=["llm"], admin_key=KEY,
                                  gateway=GatewayLimits(livez_timeout_s=LIVEZ_TIMEOUT_S), exit_timeout_s=3)
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("gateway-llm")) as running:
        yield running


def start_then_go_away(server, path: str, body: dict) -> None:
    """COUNT long generations sent through the gateway, their connections closed once the engine runs them all."""
    socks = [connect(server.http_url) for _ in range(COUNT)]
    for sock in socks:
        sock.sendall(request_bytes("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}))
    wait_for_metric(server.metrics_url, RUNNING, "llm", lambda value: value == COUNT, timeout_s=60)
    for sock in socks:
        sock.close()


def seconds_until_idle(server, timeout_s: float) -> float:
    start = time.monotonic()
    wait_for_metric(server.metrics_url, RUNNING, "llm", lambda value: value == 0, timeout_s=timeout_s)
    return time.monotonic() - start


@pytest.mark.parametrize("path", ["/v2/models/llm/generate", "/v2/models/llm/generate_stream"])
def test_a_streamed_generation_ends_when_its_client_goes_away(server, path):
    start_then_go_away(server, path, {**LONG, "stream": True})
    waited = seconds_until_idle(server, 10)
    print(f"\n{path}: no request running {waited:.1f} s after the clients went away")
    assert waited < 3, waited


def test_a_generation_that_answers_once_ends_when_its_client_goes_away(server):
    start_then_go_away(server, "/v2/models/llm/generate", LONG)
    waited = seconds_until_idle(server, 10)
    print(f"\nanswers once: no request running {waited:.1f} s after the clients went away")
    assert waited < 3, waited


def test_directly_against_triton_a_generation_that_answers_once_runs_on(server):
    """Triton 2.51's own limit, which the gateway works around (the module's docstring)."""
    socks = [connect(server.triton_http_url) for _ in range(COUNT)]
    for sock in socks:
        sock.sendall(request_bytes("POST", "/v2/models/llm/generate", json.dumps(LONG).encode(),
                                   {"Content-Type": "application/json"}))
    wait_for_metric(server.metrics_url, RUNNING, "llm", lambda value: value == COUNT, timeout_s=60)
    for sock in socks:
        sock.close()
    time.sleep(3)
    assert metric_value(server.metrics_url, RUNNING) == COUNT
    seconds_until_idle(server, 120)


def livez(server) -> tuple[int, dict]:
    status, _, body = exchange(server.http_url, "GET", "/livez")
    return status, json.loads(body)


def test_livez_is_200_while_triton_answers_and_503_while_it_does_not(server):
    assert livez(server) == (200, {"live": True})                    # its probe sends the admin key
    with stopped(server.process.pid):                                # as wedged: connections accepted, no answer
        start = time.monotonic()
        status, body = livez(server)
        waited = time.monotonic() - start
    assert status == 503 and body["error"] == (
        f"tritonserver is not live: no answer to the repository index within {LIVEZ_TIMEOUT_S:g} s (livez_timeout_s)")
    assert LIVEZ_TIMEOUT_S <= waited < LIVEZ_TIMEOUT_S + 1, waited
    wait_until(lambda: livez(server)[0] == 200, "livez to answer 200 again", timeout_s=10)
