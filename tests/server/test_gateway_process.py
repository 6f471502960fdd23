"""The gateway as a process of `ragstack serve`: started with the server in serve's process group, the
public URL printed, and a gateway that dies reported (and the server stopped) like a server that dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from raw_http import exchange
from ragstack import process_tree
from server_helpers import FIXTURE_REPOSITORY, free_server_options

pytestmark = pytest.mark.server


def test_serve_prints_the_gateway_and_reports_its_death(tmp_path):
    opts = free_server_options()
    serve = subprocess.Popen(
        [sys.executable, "-m", "ragstack.cli", "serve", "--model-repository", str(FIXTURE_REPOSITORY),
         "--models", "echo", "--http-port", str(opts.http_port), "--grpc-port", str(opts.grpc_port),
         "--metrics-port", str(opts.metrics_port), "--max-body-bytes", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in serve.stdout:
            lines.append(line)
            if "[serve] ready" in line:
                break
        assert f"HTTP http://127.0.0.1:{opts.http_port} " in lines[-1], "".join(lines)
        [gateway] = process_tree.module_pids(serve.pid, "ragstack.gateway")
        assert os.getpgid(gateway) == os.getpgid(serve.pid)          # a Ctrl-C reaches it too
        status, _, body = exchange(f"127.0.0.1:{opts.http_port}", "POST", "/v2/models/echo/infer", b" " * 1001)
        assert status == 413 and b"the limit is 1000 (max_body_bytes)" in body   # the flag reached it

        os.kill(gateway, signal.SIGKILL)
        rest = serve.communicate(timeout=60)[0]
    finally:
        if serve.poll() is None:
            serve.kill()
    assert serve.returncode == 1, rest
    assert "[serve] unexpectedly, the HTTP gateway exited with code -9" in rest, rest
    assert not process_tree.is_alive(gateway)
