"""Connection limits, decided when a connection is accepted: past max_connections_per_client a client
gets 429, past max_connections anyone gets 503, each with Retry-After, and the connection is closed.
An idle connection sends no request to refuse, so the answer goes first. Refusals are logged as a
count every LOG_EVERY_S, not one line each: a flood must not fill the disk."""
from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from collections.abc import Callable

from ragstack.gateway.errors import error_body
from ragstack.gateway.limits import LINGERING_MAX, GatewayLimits

LOG_EVERY_S = 10.0
# A refused client that already sent its request must read the answer before the close: closing with
# unread input resets the connection, and the reset can overtake the answer.
LINGER_S = 1.0


def canned_response(status: str, message: str) -> bytes:
    body = error_body(message)
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Retry-After: 1\r\nConnection: close\r\n\r\n").encode() + body


class Admission:
    """Admitted connections, in all and per client address, and refused ones still lingering."""

    def __init__(self, limits: GatewayLimits):
        self.limits = limits
        self.total = 0
        self.per_client: Counter[str] = Counter()
        self.lingering = 0
        self._refused: Counter[str] = Counter()
        self._logged_at = time.monotonic()

    def admit(self, client: str) -> asyncio.Protocol | None:
        """None when the connection is admitted (release it when it closes), else the protocol that refuses it."""
        limits = self.limits
        if self.total >= limits.max_connections:
            # Closed at once: lingering would hold descriptors when they are scarce.
            return self._refusal("max_connections", "503 Service Unavailable", (
                f"the gateway has {limits.max_connections} connections open, its limit (max_connections); "
                "retry later"), linger=False)
        if self.per_client[client] >= limits.max_connections_per_client:
            return self._refusal("max_connections_per_client", "429 Too Many Requests", (
                f"{client} has {limits.max_connections_per_client} connections open, the limit per client "
                "(max_connections_per_client); reuse them or retry later"), linger=self.lingering < LINGERING_MAX)
        self.total += 1
        self.per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if not self.per_client[client]:
            del self.per_client[client]

    def _refusal(self, limit: str, status: str, message: str, linger: bool) -> asyncio.Protocol:
        self._refused[limit] += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            counts = ", ".join(f"{n} over {name}" for name, n in sorted(self._refused.items()))
            print(f"[gateway] refused connections in the last {now - self._logged_at:.0f} s: {counts}; "
                  f"{self.total} open", file=sys.stderr, flush=True)
            self._refused.clear()
            self._logged_at = now
        return Refusal(canned_response(status, message), self if linger else None)


class Refusal(asyncio.Protocol):
    """Writes the refusal; then closes, or first lingers LINGER_S reading what the client sends."""

    def __init__(self, response: bytes, lingering_in: Admission | None):
        self.response, self.lingering_in = response, lingering_in
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        transport.write(self.response)
        if self.lingering_in is None:
            transport.close()
            return
        self.lingering_in.lingering += 1
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """Dropped: read only so that the close does not reset the connection."""

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self.lingering_in.lingering -= 1


class Gate(asyncio.Protocol):
    """One accepted connection: served by the protocol `serve()` makes (aiohttp's request handler) if
    the admission lets it in, else refused; an admitted one is released when it closes."""

    def __init__(self, admission: Admission, serve: Callable[[], asyncio.Protocol]):
        self.admission, self.serve = admission, serve
        self.client = ""
        self.inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple) else str(peer)
        self.inner = self.admission.admit(self.client) or self.serve()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not isinstance(self.inner, Refusal):
            self.admission.release(self.client)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
