"""HTTP over plain sockets, for the gateway tests: requests no HTTP client library would send (a header
byte at a time, a body that stops, thousands of idle connections from chosen loopback addresses), and
responses read as they are on the wire."""
from __future__ import annotations

import selectors
import socket
import time
from pathlib import Path


def connect(url: str, source: str = "127.0.0.1", timeout_s: float = 10.0) -> socket.socket:
    """A connection to host:port from `source` (any 127.x.y.z is this machine's loopback)."""
    host, port = url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s, source_address=(source, 0))


def request_bytes(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway-test"]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one response with a Content-Length, or ending at
    the close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head; got {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (h.split(":", 1) for h in header_lines)}
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def exchange(url: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    with connect(url, source) as sock:
        sock.sendall(request_bytes(method, path, body, headers))
        return read_response(sock)


def unread(sock: socket.socket) -> int:
    """Bytes sent on `sock` that the process at the other end has not read yet: those in this socket's send
    queue and those in the peer socket's receive queue (Linux's /proc/net/tcp; IPv4, both ends on this
    machine). 0 once the peer has every byte sent, whether or not it has answered."""
    def address(host_port) -> str:  # as /proc/net/tcp writes it: the IPv4 address in host byte order
        return f"{socket.inet_aton(host_port[0])[::-1].hex().upper()}:{host_port[1]:04X}"

    ours, theirs = address(sock.getsockname()), address(sock.getpeername())
    queued = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        tx, rx = (int(n, 16) for n in fields[4].split(":"))
        if (fields[1], fields[2]) == (ours, theirs):
            queued["send"] = tx
        elif (fields[1], fields[2]) == (theirs, ours):
            queued["receive"] = rx
    if len(queued) != 2:
        raise LookupError(f"no connection {ours} <-> {theirs} in /proc/net/tcp (found {sorted(queued)})")
    return queued["send"] + queued["receive"]


def closed_within(sock: socket.socket, timeout_s: float) -> float | None:
    """Seconds until the peer closed `sock` (whatever it sent first is read and dropped), or None."""
    start = time.monotonic()
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def answered(socks: list[socket.socket], wait_s: float) -> dict[socket.socket, bytes]:
    """What each of `socks` received within `wait_s` (nothing sent to them): the first bytes of each that
    got any."""
    got: dict[socket.socket, bytes] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0 and len(got) < len(socks):
            for key, _ in selector.select(left):
                try:
                    got[key.fileobj] = key.fileobj.recv(4096)
                except ConnectionResetError:
                    got[key.fileobj] = b""
                selector.unregister(key.fileobj)
    return got
