"""The HTTP gateway in front of the session server: what passes through it answers as Triton does
directly (side by side, on Triton's own loopback port behind it), streams pass as they are made, and
/livez answers. Hostile input and connection limits: tests/faults/test_gateway_*.py."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from raw_http import exchange

pytestmark = pytest.mark.server
GREEDY = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}


def post(url: str, path: str, body: bytes, method: str = "POST", headers: dict | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://{url}{path}", data=body or None, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_content_type(), exc.read()


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/v2/models/llm/generate", {"text_input": "Hello there", "parameters": GREEDY}),
    ("POST", "/v2/models/llm/versions/1/generate", {"text_input": "Hello there", "parameters": GREEDY}),
    ("POST", "/v2/models/llm/generate", {"text_input": "Hello", "stream": True, "parameters": GREEDY}),
    ("POST", "/v2/models/llm/generate_stream", {"text_input": "Hello", "stream": True, "parameters": GREEDY}),
    ("POST", "/v2/models/llm/generate", {"text_input": ""}),
    ("POST", "/v2/models/llm/generate_stream", {"text_input": ""}),
    ("POST", "/v2/models/nope/generate", {"text_input": "Hi"}),
    ("GET", "/v2/models/llm/generate", None),
    ("POST", "/v2/models/embed/infer", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}),
    ("POST", "/v2/models/embed/infer", {"inputs": []}),
    ("GET", "/v2/models/retriever", None),
    ("GET", "/v2/models/stats", None),
    ("POST", "/v2/repository/index", {}),
    ("GET", "/v2/health/ready", None),
])
def test_answers_as_triton_does_directly(triton_server, method, path, body):
    """Where the gateway knows better it differs on purpose (a generate value it cannot convert is a
    400 naming it, not Triton's 500: test_vllm_backend_compat); everything else passes unchanged."""
    data = json.dumps(body).encode() if body is not None else b""
    through = comparable(*post(triton_server.http_url, path, data, method))
    assert through == comparable(*post(triton_server.triton_http_url, path, data, method))


def comparable(status: int, kind: str, raw: bytes):
    """What must agree: statistics move with each call (the models served must not), and a stream
    may cut the same text into other pieces."""
    if kind == "text/event-stream":
        events = [json.loads(event[len(b"data: "):]) for event in raw.split(b"\n\n") if event]
        return (status, kind, "".join(e.get("text_output", "") for e in events), events[-1].get("finish_reason"),
                [e["error"] for e in events if "error" in e])
    if b'"model_stats"' in raw:
        return status, kind, sorted(m["name"] for m in json.loads(raw)["model_stats"])
    return status, kind, raw


def test_streamed_events_pass_as_they_are_made(triton_server):
    body = json.dumps({"text_input": "Hello", "stream": True,
                       "parameters": {**GREEDY, "max_tokens": 400}}).encode()
    request = urllib.request.Request(f"http://{triton_server.http_url}/v2/models/llm/generate_stream", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    arrivals = []
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers.get_content_type() == "text/event-stream"
        for line in response:
            if line.startswith(b"data: "):
                assert b'"error"' not in line, line
                arrivals.append(time.monotonic() - start)
    assert len(arrivals) > 100  # (a token that ends inside a character waits for the next)
    assert arrivals[0] < arrivals[-1] / 4, (arrivals[0], arrivals[-1])  # not all at the end


def test_binary_tensors_compression_and_repository_calls(triton_server):
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    answers = []
    for url in (triton_server.http_url, triton_server.triton_http_url):
        client = httpclient.InferenceServerClient(url)
        tensor = httpclient.InferInput("INPUT", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        output = httpclient.InferRequestedOutput("OUTPUT", binary_data=True)
        compressed = client.infer("echo", [tensor], outputs=[output], request_compression_algorithm="gzip",
                                  response_compression_algorithm="gzip")
        answers.append((compressed.as_numpy("OUTPUT").tolist(), client.get_model_metadata("echo"),
                        client.get_model_config("echo"), client.is_model_ready("echo"),
                        sorted(m["name"] for m in client.get_model_repository_index())))
        client.close()
    assert answers[0] == answers[1] and answers[0][0] == data.tolist()


def test_a_curl_d_json_body_works(triton_server):
    """`curl -d` sends application/x-www-form-urlencoded; the README's generate call."""
    status, _, body = post(triton_server.http_url, "/v2/models/llm/generate",
                           json.dumps({"text_input": "Hello", "parameters": {"max_tokens": 4}}).encode(),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and json.loads(body)["text_output"].startswith("Hello")


def test_hop_by_hop_headers_stay_with_their_connection(triton_server):
    status, headers, body = exchange(triton_server.http_url, "POST", "/v2/models/echo/infer", json.dumps(
        {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode(),
        {"Connection": "close, X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5", "TE": "trailers",
         "Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]
    assert headers["connection"] == "close" and "transfer-encoding" not in headers


def test_livez_answers_while_triton_does(triton_server):
    status, _, body = exchange(triton_server.http_url, "GET", "/livez")
    assert (status, json.loads(body)) == (200, {"live": True})
