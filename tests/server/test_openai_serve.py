"""The OpenAI frontend as a process of `ragstack serve`, with an API key (from a file) and the admin key (from
$RAGSTACK_ADMIN_KEY): its URL printed, its flags passed on, every API call needing the bearer key and model
load and unload the admin key, neither key on its command line (the API key on none), a stalled body
holding its place in max_inflight only until body_timeout, and a frontend that dies reported (and the server
stopped) like a server that dies. The tests run in order on one `ragstack serve`."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest
from openai import AuthenticationError, OpenAI

from ragstack import admin_key, openai_frontend, process_tree, serve
from ragstack.launcher import free_port
from raw_http import connect, read_response, request_bytes
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server
ADMIN_KEY = "0123456789abcdef0123456789abcdef"
API_KEY = "sk-ragstack-test-0123456789"


# Two models loaded only by a test: one the API serves (its tensors an embed model's), one whose load fails.
EMBED_LIKE = {"config.pbtxt": 'backend: "python"\ninput [ { name: "text" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
                              'output [ { name: "embedding" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n',
              "1/model.py": "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"}
SLOW = {"config.pbtxt": EMBED_LIKE["config.pbtxt"],
        "1/model.py": "import time\n\nclass TritonPythonModel:\n    def initialize(self, args):\n"
                      "        time.sleep(4)\n\n    def execute(self, requests):\n        return []\n"}
BROKEN = {"config.pbtxt": EMBED_LIKE["config.pbtxt"],
          "1/model.py": "class TritonPythonModel:\n    def initialize(self, args):\n"
                        "        raise RuntimeError('broken on purpose')\n"}


def repository(root: Path, models: dict[str, dict[str, str]]) -> Path:
    for name, files in models.items():
        for relative, text in files.items():
            (root / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / name / relative).write_text(text)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("openai-key") / "key"
    key_file.write_text(API_KEY + "\n")
    extra = repository(tmp_path_factory.mktemp("models"), {"embed_like": EMBED_LIKE, "slow": SLOW, "broken": BROKEN})
    opts, port = free_server_options(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ragstack.cli", "serve", "--model-repository", str(FIXTURE_REPOSITORY),
         "--model-repository", str(extra), "--models", "echo", "--http-port", str(opts.http_port),
         "--grpc-port", str(opts.grpc_port), "--metrics-port", str(opts.metrics_port), "--openai-port", str(port),
         "--openai-api-key-file", str(key_file),
         "--openai-max-body-bytes", "1000", "--openai-max-inflight", "1", "--openai-body-timeout", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, admin_key.ENV: ADMIN_KEY})
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "[serve] OpenAI API" in line or process.poll() is not None:
            break
    try:
        yield process, port, "".join(lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_frontend_needs_its_keys_and_takes_its_flags(served):
    process, port, printed = served
    url = f"http://127.0.0.1:{port}"
    assert f"[serve] OpenAI API {url}/v1 " in printed and "API key required" in printed, printed
    [frontend] = process_tree.module_pids(process.pid, "ragstack.openai_frontend")
    assert os.getpgid(frontend) == os.getpgid(process.pid)                    # a Ctrl-C reaches it too
    for pid in [process.pid, *process_tree.descendants(process.pid)]:
        assert API_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    # The admin key only on tritonserver's (docs/operations.md, Access: Triton takes it no other way).
    assert ADMIN_KEY.encode() not in Path(f"/proc/{frontend}/cmdline").read_bytes()

    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    unauthorized = httpx.get(f"{url}/v1/models")
    assert unauthorized.status_code == 401 and unauthorized.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(f"{url}/score", json={"text_1": "q", "text_2": "d"}).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/metrics").status_code == 200
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(f"{url}/v1/models", headers=bearer).json() == {"object": "list", "data": []}   # echo: no endpoint
    too_big = httpx.post(f"{url}/v1/embeddings", headers={**bearer, "Content-Type": "application/json"},
                         content=b" " * 1001)
    assert too_big.status_code == 413 and "the limit is 1000 (max_body_bytes)" in too_big.text   # the flag reached it

    for headers in (bearer, {**bearer, admin_key.HEADER: "wrong-key-wrong-key"}):
        refused = httpx.post(f"{url}/v1/models/echo/unload", headers=headers)
        assert refused.status_code == 403 and admin_key.HEADER in refused.json()["error"]["message"]
    admin = {**bearer, admin_key.HEADER: ADMIN_KEY}
    assert httpx.post(f"{url}/v1/models/echo/unload", headers=admin, timeout=60).json()["loaded"] is False
    assert httpx.post(f"{url}/v1/models/echo/load", headers=admin, timeout=60).json()["loaded"] is True
    missing = httpx.post(f"{url}/v1/models/no_such_model/load", headers=admin, timeout=60)
    assert 400 <= missing.status_code < 500 and "no_such_model" in missing.json()["error"]["message"]


def test_a_stalled_body_holds_a_place_until_its_timeout(served):
    """With max_inflight 1, a request whose body stalls makes the next one 503 with Retry-After until the
    body timeout (1 s) answers it 408; health stays open meanwhile."""
    _, port, _ = served
    url = f"127.0.0.1:{port}"
    with connect(url) as stalled:
        stalled.sendall(request_bytes("POST", "/v1/embeddings", headers={
            "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json", "Content-Length": "100"}) + b"{")
        time.sleep(0.3)
        refused = httpx.post(f"http://{url}/v1/embeddings", headers={"Authorization": f"Bearer {API_KEY}"}, json={})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        assert "the limit (max_inflight)" in refused.json()["error"]["message"]
        assert httpx.get(f"http://{url}/health").status_code == 200
        status, _, body = read_response(stalled)
    assert status == 408 and b"no request body data for 1 s (body_timeout_s)" in body
    assert httpx.post(f"http://{url}/v1/embeddings", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={}).status_code == 400   # its place is free again: answered, not refused


def test_a_failed_load_is_the_servers_fault_and_leaves_the_api_serving(served):
    """Triton 2.51's strict readiness stays false after a failed load; /health, the frontend's readiness
    probe, stays 200 while Triton is live and a model of the API's is ready."""
    process, port, _ = served
    url, admin = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {API_KEY}", admin_key.HEADER: ADMIN_KEY}
    assert httpx.post(f"{url}/v1/models/embed_like/load", headers=admin, timeout=60).json()["loaded"] is True
    failed = httpx.post(f"{url}/v1/models/broken/load", headers=admin, timeout=60)
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "model_load_failed", failed.text
    assert "broken on purpose" in failed.json()["error"]["message"]
    [gateway] = [line.split()[3] for line in served[2].splitlines() if line.startswith("[serve] ready")]
    assert httpx.get(f"{gateway}/v2/health/ready").status_code != 200   # Triton's own readiness: gone
    assert httpx.get(f"{gateway}/readyz").json() == {"ready": True}      # the gateway's: the others serve
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and "not ready" in health.json()["triton"], health.text
    models = httpx.get(f"{url}/v1/models", headers=admin).json()["data"]
    assert [m["id"] for m in models] == ["embed_like"]


def test_a_model_loading_is_503_unavailable_not_404(served):
    """While Triton loads a model (4 s here), a request for it is 503 with Retry-After, which the SDKs retry,
    not 404 model_not_found, which they give up on."""
    _, port, printed = served
    [gateway] = [line.split()[3] for line in printed.splitlines() if line.startswith("[serve] ready")]
    url, bearer = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {API_KEY}"}
    with ThreadPoolExecutor(1) as pool:   # through the gateway: the frontend's one place (max_inflight) stays free
        load = pool.submit(httpx.post, f"{gateway}/v2/repository/models/slow/load",
                           headers={admin_key.HEADER: ADMIN_KEY}, timeout=60)
        answers = []
        while not load.done():
            answer = httpx.post(f"{url}/v1/embeddings", headers=bearer, json={"model": "slow", "input": "x"})
            answers.append((answer.status_code, answer.headers.get("retry-after"), answer.json()["error"]))
            time.sleep(0.3)
        assert load.result().status_code == 200, load.result().text
    # 404 only before Triton marks it loading (and the frontend reads its index again: 4 times a second), then 503
    # until it is loaded (the last answers may come from the loaded model)
    first = next((i for i, a in enumerate(answers) if a[0] != 404), len(answers))
    loading = [a for a in answers[first:] if a[0] == 503]
    assert all(a[0] != 404 for a in answers[first:]), answers
    assert len(loading) >= 5 and all(a[1] == "5" and a[2]["code"] == "unavailable"
                                     and a[2]["message"] == "model 'slow' is loading; retry in a few seconds"
                                     for a in loading), answers
    # loaded: found at once, though the frontend had it as not loaded a moment ago (its config cache)
    loaded = httpx.post(f"{url}/v1/embeddings", headers=bearer, json={"model": "slow", "input": "x"})
    assert loaded.status_code not in (404, 503), loaded.text
    assert httpx.post(f"{gateway}/v2/repository/models/slow/unload", headers={admin_key.HEADER: ADMIN_KEY},
                      timeout=60).status_code == 200


def test_serve_reports_the_frontends_death(served):
    process, _, _ = served
    [frontend] = process_tree.module_pids(process.pid, "ragstack.openai_frontend")
    os.kill(frontend, signal.SIGKILL)
    rest = process.communicate(timeout=60)[0]
    assert process.returncode == 1, rest
    assert "[serve] unexpectedly, the OpenAI frontend exited with code -9" in rest, rest


def test_serve_runs_the_frontend_on_9000_unless_told_0():
    """(The launcher starts a frontend only for a port: test_launcher's servers have none.)"""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.options_from_args(parser.parse_args([])).openai_port == openai_frontend.DEFAULT_PORT == 9000
    assert serve.options_from_args(parser.parse_args(["--openai-port", "0"])).openai_port == 0
    for flag, value in (("--openai-port", "70000"), ("--http-port", "0"), ("--grpc-port", "-1")):
        with pytest.raises(SystemExit) as refused:   # argparse's error, naming the flag
            parser.parse_args([flag, value])
        assert refused.value.code == 2
