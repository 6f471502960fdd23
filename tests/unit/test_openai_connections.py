"""The OpenAI frontend's connections, on a frontend of its own with no Triton behind it (none of this reaches
Triton): the idle timeout from a connection's opening to a whole request head, which a head sent a byte at a
time does not stretch; a body's whole deadline; HEAD where GET; a 405's Allow; no redirect for a trailing
slash."""
from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

import pytest

from ragstack.launcher import free_port
from raw_http import connect, read_response, request_bytes

IDLE_S, BODY_S = 2.0, 1.0


@pytest.fixture(scope="module")
def frontend():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{port}",
                             "--triton", f"127.0.0.1:{free_port()}", "--openai-idle-timeout", str(IDLE_S),
                             "--openai-body-timeout", str(BODY_S), "--exit-timeout", "1"])
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the frontend did not start"
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)


def closed_after(sock: socket.socket, limit_s: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes `sock` (None: open after limit_s), sending a byte of `trickle` every
    0.3 s meanwhile."""
    start = time.monotonic()
    for byte in [trickle[i:i + 1] for i in range(len(trickle))] or [b""] * 1000:
        if time.monotonic() - start > limit_s:
            return None
        if select.select([sock], [], [], 0.3)[0]:
            if sock.recv(4096) == b"":
                return time.monotonic() - start
        elif byte:
            sock.sendall(byte)
    return None


def test_a_silent_connection_is_closed_at_the_idle_timeout(frontend):
    with connect(frontend) as sock:
        waited = closed_after(sock, 3 * IDLE_S)
    assert waited is not None and IDLE_S - 0.5 < waited < IDLE_S + 1.5, waited


def test_a_head_sent_a_byte_at_a_time_is_closed_at_the_idle_timeout(frontend):
    head = request_bytes("GET", "/version", headers={"X-Padding": "p" * 200})
    with connect(frontend) as sock:
        waited = closed_after(sock, 3 * IDLE_S, trickle=head)
    assert waited is not None and IDLE_S - 0.5 < waited < IDLE_S + 1.5, waited


def test_a_kept_alive_connection_serves_until_idle(frontend):
    with connect(frontend) as sock:
        for _ in range(2):
            sock.sendall(request_bytes("GET", "/version"))
            status, _, body = read_response(sock)
            assert status == 200 and b"version" in body
            time.sleep(IDLE_S / 2)   # each answer starts the timeout again
        waited = closed_after(sock, 3 * IDLE_S)
    assert waited is not None and waited < IDLE_S, waited


def test_a_body_sent_a_byte_at_a_time_ends_at_its_whole_deadline(frontend):
    """Each byte comes within body_timeout_s, yet the body gets body_timeout_s plus a second per 64 KiB it
    declares: a trickle cannot hold its place in max_inflight for longer."""
    with connect(frontend) as sock:
        sock.sendall(request_bytes("POST", "/v1/completions", headers={
            "Content-Type": "application/json", "Content-Length": "100"}) + b"{")
        start = time.monotonic()
        while not select.select([sock], [], [], 0.3)[0] and time.monotonic() - start < 10:
            sock.sendall(b" ")
        status, _, body = read_response(sock)
    assert status == 408 and b"the request body took more than 1 s (body_timeout_s, plus 1 s per 64 KiB" in body
    assert time.monotonic() - start < BODY_S + 1.5


def test_head_where_get_and_a_405_names_the_methods(frontend):
    with connect(frontend) as sock:
        sock.sendall(request_bytes("HEAD", "/version"))
        status, headers, _ = read_response_head(sock)
        assert status == 200 and headers["content-type"] == "application/json"
        sock.sendall(request_bytes("PUT", "/version"))
        status, headers, body = read_response(sock)
    assert status == 405 and set(headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
    assert b"/version does not take PUT" in body
    with connect(frontend) as sock:
        sock.sendall(request_bytes("HEAD", "/metrics"))
        status, headers, rest = read_response_head(sock)
    assert status == 200 and headers["content-type"].startswith("text/plain") and rest == b""


def test_a_trailing_slash_is_no_route_not_a_redirect(frontend):
    with connect(frontend) as sock:
        sock.sendall(request_bytes("GET", "/version/"))
        status, _, body = read_response(sock)
    assert status == 404 and b"no route /version/" in body


def read_response_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """A HEAD answer: its Content-Length says the body a GET would get, and none follows."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines)}
    return int(status_line.split()[1]), headers, rest
