"""Why a request got no answer from a server at host:port, in one line naming the likely cause and the fix.

The transports call `explain` once a request failed without a server's answer (refused, reset, a reply
that is not the protocol spoken). It probes the port once: a TCP connection, then an HTTP/1 request,
whose reply tells an HTTP server ("HTTP/1.1 ...") from a gRPC one (every HTTP/2 server opens with a
SETTINGS frame) and from TLS (an alert record, or a handshake that succeeds). A client that connects
with TLS probes with its own trust settings: a handshake refused for the certificate (untrusted, or not
for that host), a port that answers in the clear, then the same HTTP/1 request inside TLS. What the probe
sees is certain; which server port it is, is a guess, and the message says "likely".
"""
from __future__ import annotations

import socket
import ssl

from ragstack.client import DEFAULT_PORTS
from ragstack.tls import TlsOptions

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


# HTTP/2's client preface and an empty SETTINGS frame: an HTTP/2 server answers with its SETTINGS.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"


def _tls_reply(tls_sock: ssl.SSLSocket, host: str, port: int) -> tuple[bytes, str]:
    """The first bytes inside TLS (to HTTP/2's preface where ALPN chose h2, else to an HTTP/1 request),
    or b"" with why: the server's alert, a close right after the handshake ("" when it stays silent)."""
    try:
        if tls_sock.selected_alpn_protocol() == "h2":
            tls_sock.sendall(H2_PREFACE)
        else:
            tls_sock.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                             .encode())
        first = tls_sock.recv(64)
    except ssl.SSLError as exc:  # e.g. a server that wants a client certificate says so here (TLS 1.3)
        return b"", exc.reason or str(exc)
    except TimeoutError:
        return b"", ""
    except OSError:
        first = b""
    return first, "" if first else "the server closed the connection after the handshake"


def _speaks(first: bytes) -> str:
    """"http", "grpc" or "" from the first bytes an HTTP/1 request got back."""
    if first.startswith(b"HTTP/"):
        return "http"
    if len(first) >= 9 and first[3] == 0x04 and first[5:9] == b"\0\0\0\0":  # SETTINGS on stream 0
        return "grpc"
    return ""


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE   # what, not whom
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ssl.SSLError):
        return False


def _connect(host: str, port: int, timeout_s: float) -> tuple[socket.socket | None, str, str]:
    """A connection, or None with what happened: "unresolved", "refused", "no answer", "unreachable"."""
    try:
        return socket.create_connection((host, port), timeout=timeout_s), "", ""
    except socket.gaierror as exc:
        return None, "unresolved", exc.strerror or str(exc)
    except ConnectionRefusedError:
        return None, "refused", ""
    except TimeoutError:
        return None, "no answer", ""
    except OSError as exc:
        return None, "unreachable", exc.strerror or str(exc)


def probe(host: str, port: int, timeout_s: float = 3.0) -> tuple[str, str]:
    """(what answers at host:port, detail). Without a connection: "unresolved", "refused", "no answer"
    (nothing within timeout_s) or "unreachable". With one: "http" (HTTP/1), "grpc" (HTTP/2, the
    transport of gRPC), "tls", "silent" (sends nothing, and no TLS either) or "other" (the bytes)."""
    sock, kind, detail = _connect(host, port, timeout_s)
    if sock is None:
        return kind, detail
    with sock:
        first = _first_bytes(sock, host, port)
    if _speaks(first):
        return _speaks(first), ""
    if first[:2] == b"\x15\x03" or (not first and _speaks_tls(host, port, timeout_s)):  # an alert; a handshake
        return "tls", ""
    return ("silent", "") if not first else ("other", repr(first[:16]))


def probe_tls(host: str, port: int, tls: TlsOptions, protocol: str, timeout_s: float = 3.0) -> tuple[str, str]:
    """probe() for a client of `protocol` that connects with TLS under `tls`: the same connection
    outcomes, then "untrusted" (the handshake failed on the certificate: the detail says why),
    "cleartext" (no TLS there: the detail is what probe() sees in the clear), "tls failed" (another TLS
    failure: the detail), or what speaks inside TLS: "http", "grpc", "silent", "other". Offered ALPN as
    the clients do: h2 and http/1.1 for gRPC (an HTTP/2 answer is taken for gRPC: an HTTP/2 web server cannot
    be told apart without a gRPC call), http/1.1 alone for HTTP (refused for want of a protocol: HTTP/2 only,
    so gRPC)."""
    sock, kind, detail = _connect(host, port, timeout_s)
    if sock is None:
        return kind, detail
    context = tls.context()
    context.set_alpn_protocols(["h2", "http/1.1"] if protocol == "grpc" else ["http/1.1"])
    with sock:
        try:
            tls_sock = context.wrap_socket(sock, server_hostname=host)
        except ssl.SSLCertVerificationError as exc:
            return "untrusted", exc.verify_message or exc.reason or str(exc)
        except ssl.SSLError as exc:
            if "NO_APPLICATION_PROTOCOL" in (exc.reason or ""):
                return "grpc", ""
            clear = probe(host, port, timeout_s)[0]  # not TLS (a reply in the clear), or TLS that failed
            return ("cleartext", clear) if clear in NAMES else ("tls failed", exc.reason or str(exc))
        except OSError:  # closed or reset at the ClientHello
            clear = probe(host, port, timeout_s)[0]
            return ("cleartext", clear) if clear in NAMES else ("silent", "")
        with tls_sock:
            first, failure = _tls_reply(tls_sock, host, port)
    if _speaks(first):
        return _speaks(first), ""
    if failure:
        return "tls failed", failure
    return ("silent", "") if not first else ("other", repr(first[:16]))


def explain(protocol: str, host: str, port: int, timeout_s: float = 3.0, tls: TlsOptions | None = None) -> str | None:
    """The one-line message for a request over `protocol` ("grpc" or "http") to host:port that got no
    answer, connecting with TLS under `tls` or without it; None when the port does speak `protocol`
    (with TLS: and the handshake succeeds), so the failure was the server's, not the connection's."""
    kind, detail = probe(host, port, timeout_s) if tls is None else probe_tls(host, port, tls, protocol, timeout_s)
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
    if kind == "untrusted":
        insecure = ", or --insecure to skip the check (testing only)" if protocol == "http" else ""
        return (f"the TLS certificate of {where} is not accepted ({detail}) — give the CA that signed it with "
                f"--ssl-ca FILE (TlsOptions(ca_file=...) in the client API){insecure}; the host in {_URL} "
                "must be one the certificate names")
    if kind == "cleartext":
        speaks = f"it speaks {NAMES[detail]} without TLS" if detail in NAMES else "it does not answer TLS"
        return (f"{where} does not speak TLS ({speaks}) — connect without TLS (host:port or {protocol}:// "
                f"in {_URL}, no --ssl options), or use the port of the proxy that terminates TLS")
    if kind == "tls failed":
        return (f"the TLS handshake with {where} failed ({detail}) — check the TLS options (--ssl-ca; --ssl-cert "
                "and --ssl-key where the server asks for a client certificate)")
    if kind == other:
        return (f"nothing answers {name} at {where} — it speaks {NAMES[other]}, so it is likely the server's "
                f"{NAMES[other]} port{' (or its metrics port)' if other == 'http' else ''}; use --protocol {other}, "
                f"or the {name} port ({DEFAULT_PORTS[protocol]} by default)")
    if kind == "tls":
        return (f"{where} expects TLS, and the client connects without it — connect with TLS: "
                f"{'https' if protocol == 'http' else 'grpcs'}://{where} in {_URL} (or --ssl), with --ssl-ca FILE "
                f"when a private CA signed its certificate; or use the server's own {name} port "
                f"({DEFAULT_PORTS[protocol]} by default)")
    sent = f" (it sent {detail})" if detail else ""
    return (f"{where} accepts connections but answers neither HTTP nor gRPC{sent} — likely another service on "
            f"that port; check {_URL} ({port_is})")
