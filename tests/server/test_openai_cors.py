"""Web pages of other origins (CORS) on a frontend of the session server's gRPC port with an API key:
none is let by default; `--openai-allowed-origins` lets those named, whose browsers' preflights pass
without the key (they carry none) and whose requests still need it."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx2 as httpx
import pytest

from ragstack.launcher import free_port
from server_helpers import wait_until

pytestmark = pytest.mark.server
PAGE, OTHER, KEY = "https://app.example.com", "https://other.example.com", "sk-cors-test"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
BODY = {"model": "llm", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def frontend(triton_server, tmp_path_factory):
    port, log = free_port(), tmp_path_factory.mktemp("cors") / "openai.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{port}", "--triton",
             triton_server.grpc_url, "--openai-allowed-origins", PAGE], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "RAGSTACK_OPENAI_API_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), f"the frontend on {port} (log: {log})", 60)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_named_origin_s_preflight_passes_without_the_key_and_its_requests_need_it(frontend):
    preflight = httpx.options(f"{frontend}/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT}, timeout=10)
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == PAGE
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    answered = httpx.post(f"{frontend}/v1/chat/completions", json=BODY, timeout=60,
                          headers={"Origin": PAGE, "Authorization": f"Bearer {KEY}"})
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == PAGE
    refused = httpx.post(f"{frontend}/v1/chat/completions", json=BODY, timeout=60, headers={"Origin": PAGE})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == PAGE


def test_other_origins_are_not_let(frontend, triton_server):
    preflight = httpx.options(f"{frontend}/v1/chat/completions", headers={"Origin": OTHER, **PREFLIGHT}, timeout=10)
    assert preflight.status_code == 400 and "access-control-allow-origin" not in preflight.headers
    for url in (frontend, triton_server.openai_url):   # the session server's frontend lets none
        answered = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=60,
                              headers={"Origin": OTHER, "Authorization": f"Bearer {KEY}"})
        assert "access-control-allow-origin" not in answered.headers
    default = httpx.options(f"{triton_server.openai_url}/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT},
                            timeout=10)
    assert "access-control-allow-origin" not in default.headers
