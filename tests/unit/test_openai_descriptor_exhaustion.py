"""The OpenAI frontend out of file descriptors, on a frontend of its own with no Triton behind it: its hard
limit set low, so that it cannot raise the soft one (more_descriptors), and more silent clients than it has
descriptors. asyncio logs every accept that fails, as often as the loop wakes: the log budget
(log_rate_limit.py) keeps that to a few records, and once the idle timeout closes the silent connections a
request is answered again."""
from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

from ragstack.launcher import free_port
from ragstack.log_rate_limit import LOG_BURST
from raw_http import connect, read_response, request_bytes

DESCRIPTORS, CLIENTS, IDLE_S = 160, 240, 4.0


def low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))


def test_descriptor_exhaustion_logs_a_bounded_count_and_recovers(tmp_path):
    port = free_port()
    stderr = tmp_path / "frontend.err"
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{port}",
                                 "--triton", f"127.0.0.1:{free_port()}", "--openai-idle-timeout", str(IDLE_S),
                                 "--exit-timeout", "1"], stderr=err, preexec_fn=low_descriptor_limit)
    try:
        deadline = time.monotonic() + 60
        while b"listening on" not in stderr.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.2)
        silent = []
        for _ in range(CLIENTS):   # the kernel completes each handshake into the backlog, accepted or not
            silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(IDLE_S / 2)     # the accept loop fails meanwhile, each time the loop wakes
        log = stderr.read_text()
        failures = log.count("[openai] ERROR asyncio")
        assert "Too many open files" in log, log[-2000:]
        assert failures <= LOG_BURST + 1, f"{failures} asyncio records in {IDLE_S / 2:g} s"
        # the accepted silent clients are closed at the idle timeout, and the backlog is taken in turn
        time.sleep(IDLE_S * 2.5)
        for sock in silent:
            sock.close()
        with connect(f"127.0.0.1:{port}") as sock:
            sock.sendall(request_bytes("GET", "/version"))
            status, _, body = read_response(sock)
        assert status == 200 and b"version" in body
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
