"""Why a request got no answer from a server at host:port, in one line naming the likely cause and the fix.

The transports call `explain` once a request failed without a server's answer (refused, reset, a reply
that is not the protocol spoken). It probes the port once: a TCP connection, then an HTTP/1 request,
whose reply tells an HTTP server ("HTTP/1.1 ...") from a gRPC one (every HTTP/2 server opens with a
SETTINGS frame) and from TLS (an alert record, or a handshake that succeeds). What the probe sees is
certain; which server port it is, is a guess, and the message says "likely".
"""
from __future__ import annotations

import socket
import ssl

from ragstack.client import DEFAULT_PORTS

NAMES = {"grpc": "gRPC", "http": "HTTP"}
_URL = "--url (or $RAGSTACK_URL)"


def address(host: str, port: int) -> str:
    """host:port as clients and messages write it ([::1]:8001 for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _first_bytes(sock: socket.socket, host: str, port: int) -> bytes:
    """The first bytes the server sends back to an HTTP/1 request; b"" when it closes or stays silent."""
    sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    try:
        return sock.recv(64)
    except OSError:  # a timeout, or a reset: nothing came back
        return b""


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE   # what, not whom
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def probe(host: str, port: int, timeout_s: float = 3.0) -> tuple[str, str]:
    """(what answers at host:port, detail). Without a connection: "unresolved", "refused", "no answer"
    (nothing within timeout_s) or "unreachable". With one: "http" (HTTP/1), "grpc" (HTTP/2, the
    transport of gRPC), "tls", "silent" (sends nothing, and no TLS either) or "other" (the bytes)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as exc:
        return "unresolved", exc.strerror or str(exc)
    except ConnectionRefusedError:
        return "refused", ""
    except TimeoutError:
        return "no answer", ""
    except OSError as exc:
        return "unreachable", exc.strerror or str(exc)
    with sock:
        first = _first_bytes(sock, host, port)
    if first.startswith(b"HTTP/"):
        return "http", ""
    if len(first) >= 9 and first[3] == 0x04 and first[5:9] == b"\0\0\0\0":  # SETTINGS on stream 0
        return "grpc", ""
    if first[:2] == b"\x15\x03" or (not first and _speaks_tls(host, port, timeout_s)):  # an alert; a handshake
        return "tls", ""
    return ("silent", "") if not first else ("other", repr(first[:16]))


def explain(protocol: str, host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """The one-line message for a request over `protocol` ("grpc" or "http") to host:port that got no
    answer; None when the port does speak `protocol` (the failure was the server's, not the connection's)."""
    kind, detail = probe(host, port, timeout_s)
    if kind == protocol:
        return None
    name, where = NAMES[protocol], address(host, port)
    other = "http" if protocol == "grpc" else "grpc"
    port_is = f"the {name} port is {DEFAULT_PORTS[protocol]} by default"
    if kind == "unresolved":
        return f"cannot resolve the host {host!r} ({detail}) — check the host name in {_URL}"
    if kind == "refused":
        return (f"nothing listens at {where} (connection refused) — the server is not running there (start it "
                f"with `ragstack serve`), or {_URL} names the wrong host or port ({port_is})")
    if kind == "no answer":
        return (f"no answer from {where} within {timeout_s:g} s — likely a wrong host, or a firewall that drops "
                f"the connection; check {_URL}")
    if kind == "unreachable":
        return f"cannot reach {where} ({detail}) — check the host in {_URL} and the network"
    if kind == other:
        return (f"nothing answers {name} at {where} — it speaks {NAMES[other]}, so it is likely the server's "
                f"{NAMES[other]} port{' (or its metrics port)' if other == 'http' else ''}; use --protocol {other}, "
                f"or the {name} port ({DEFAULT_PORTS[protocol]} by default)")
    if kind == "tls":
        return (f"{where} expects TLS, and the ragstack client connects without it — use the server's own "
                f"{name} port ({DEFAULT_PORTS[protocol]} by default) or a proxy that forwards without TLS")
    sent = f" (it sent {detail})" if detail else ""
    return (f"{where} accepts connections but answers neither HTTP nor gRPC{sent} — likely another service on "
            f"that port; check {_URL} ({port_is})")
