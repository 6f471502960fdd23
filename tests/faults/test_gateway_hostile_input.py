"""Request bodies that crash Triton 2.51 or leave it holding memory, sent through the gateway on a server
of its own: the server lives through all of them and its memory stays where it was.

Directly against Triton (measured here, docs/operations.md "The HTTP gateway"): a body typed
application/x-www-form-urlencoded of 4 MiB or more to any path is a SIGSEGV in libevhtp's query parser
(4,000,000 bytes survive; other content types do not crash at 32 MiB); JSON nested 130k levels deep to
a model's infer or generate is a SIGSEGV in its recursive parser; 13 texts of 100 MB refused by the
embed model took tritonserver from 39 to 140 MiB RSS and /dev/shm up by 112 MiB, never given back.
"""
from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import pytest
from ragstack import process_tree
from ragstack.launcher import SHM_DIR, TritonServer
from raw_http import exchange
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server
MiB = 1 << 20
ECHO = {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
DEEP = b"[" * 130_000 + b"]" * 130_000  # 260 KB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    options = free_server_options(model_repositories=[FIXTURE_REPOSITORY], models=["echo"])
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("gateway-hostile")) as running:
        pid = running.process.pid
        yield running
        assert running.process.pid == pid and running.process.poll() is None, running.tail_log()


def post(server, path: str, body, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """urllib's POST: form-urlencoded unless told otherwise, as `curl -d` sends it."""
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def echo_answers(server) -> bool:
    status, body = post(server, "/v2/models/echo/infer", json.dumps(ECHO).encode())
    return status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


def shm_bytes(server) -> int:
    return sum(region.stat().st_size for region in SHM_DIR.glob(f"{server.shm_prefix}*"))


def test_a_4_mib_form_body_reaches_triton_as_json(server):
    form = b"a=" + b"b" * (4 * MiB - 2)                             # the size that crashes Triton, and the limit
    assert post(server, "/v2/health/live", form)[0] == 405          # Triton's answer to a POST there
    assert post(server, "/v2/health/live", form + b"b")[0] == 413
    status, body = post(server, "/v2/models/echo/infer", form)
    assert status == 500 and "failed to parse the request JSON buffer" in body, body[:300]  # as Triton answers
    # `curl -d '{...}'` (the README's) keeps working: a form-typed body that is JSON is forwarded as JSON.
    assert post(server, "/v2/models/echo/infer", json.dumps(ECHO).encode(),
                {"Content-Type": "application/x-www-form-urlencoded"})[0] == 200
    assert echo_answers(server)


@pytest.mark.parametrize("path", ["/v2/models/echo/infer", "/v2/models/echo/generate",
                                  "/v2/models/echo/generate_stream", "/v2/repository/index"])
def test_json_nested_130k_deep_is_refused_before_triton(server, path):
    status, body = post(server, path, DEEP, {"Content-Type": "application/json"})
    assert status == 400, body
    assert json.loads(body)["error"] == "the request's JSON nests 130000 levels deep; the limit is 64 (max_json_depth)"
    assert echo_answers(server)


def test_the_json_header_of_a_binary_request_is_checked_too(server):
    status, _, body = exchange(server.http_url, "POST", "/v2/models/echo/infer", DEEP + b"\0" * 8,
                               {"Inference-Header-Content-Length": str(len(DEEP))})
    assert status == 400 and "130000 levels deep" in body.decode()
    status, _, body = exchange(server.http_url, "POST", "/v2/models/echo/infer", b"{}",
                               {"Inference-Header-Content-Length": "99"})
    assert status == 400 and "Inference-Header-Content-Length '99' is not a byte count" in body.decode()


def test_100_mb_bodies_are_refused_and_leave_no_memory_behind(server):
    pid = server.process.pid
    before, shm_before = process_tree.tree_rss_bytes(pid), shm_bytes(server)
    hundred = b"{" + b" " * (100 * MiB) + b"}"
    for _ in range(13):                                              # the count
        status, body = post(server, "/v2/models/echo/infer", hundred, {"Content-Type": "application/json"})
        assert status == 413 and json.loads(body)["error"] == (
            f"the request body is {len(hundred)} bytes; the limit is {4 * MiB} (max_body_bytes)")
    chunked = urllib.request.Request(f"http://{server.http_url}/v2/models/echo/infer",
                                     data=iter([b" " * MiB] * 100), headers={"Transfer-Encoding": "chunked"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(chunked, timeout=120)
    assert refused.value.code == 413 and "counted as it arrived" in refused.value.read().decode()
    bomb = gzip.compress(b" " * (100 * MiB))                         # 100 KB that inflate to 100 MB
    status, body = post(server, "/v2/models/echo/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "counted as it arrived" in body
    assert echo_answers(server)
    grown = process_tree.tree_rss_bytes(pid) - before
    assert grown < 32 * MiB and shm_bytes(server) == shm_before, (grown / MiB, shm_bytes(server) - shm_before)
    assert process_tree.rss_bytes(server.gateway_process.pid) < 200 * MiB


def test_compressed_json_within_the_limit_is_forwarded_inflated(server):
    status, body = post(server, "/v2/models/echo/infer", gzip.compress(json.dumps(ECHO).encode()),
                        {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]
