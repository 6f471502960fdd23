"""The gateway's request handler and server: every request's body is read and checked (request_body),
generate bodies are typed and given a cancel key (generate_body), `/livez` and `/readyz` probe Triton (livez), and
every request is relayed (upstream). Connections are admitted by `admission`.

aiohttp's low-level server cancels a handler when its client's connection closes
(handler_cancellation), which closes the handler's connection to Triton in turn. Triton 2.51 cancels
the request once it sees that close, which it does only after the request's first response; for a
generate request that answers once, the gateway has the llm abort it by its cancel key.
"""
from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from ragstack.gateway import request_body
from ragstack.gateway.admission import Admission, Gate
from ragstack.gateway.errors import GatewayError
from ragstack.gateway.generate_body import GENERATE, GenerateBodies
from ragstack.gateway.limits import GatewayLimits
from ragstack.gateway.livez import Livez
from ragstack.gateway.upstream import Upstream, relay
from ragstack.listen_socket import shown, tcp_listener

LISTEN_BACKLOG = 1024


class ListenError(RuntimeError):
    """The listening address is taken or not this machine's."""


class Gateway:
    def __init__(self, upstream_address: str, limits: GatewayLimits, key: str | None):
        self.limits = limits
        self.held = request_body.Held(limits)
        self.upstream = Upstream(upstream_address, limits)
        self.bodies = GenerateBodies(self.upstream.session, upstream_address)
        self.livez = Livez(upstream_address, key, limits.livez_timeout_s)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            if not request.rel_url.raw_path.startswith("/"):
                raise GatewayError(400, f"the request target {request.rel_url.raw_path!r} is not a path")
            if request.rel_url.raw_path in ("/livez", "/readyz") and request.method == "GET":
                return await self.livez.handle(request, ready=request.rel_url.raw_path == "/readyz")
            async with request_body.read(request, self.limits, self.held) as body:
                content_type = request_body.check(body, request.headers, self.limits)
                generate = GENERATE.match(request.rel_url.path) if request.method == "POST" else None
                key = None
                if generate and content_type == request_body.JSON:
                    body, key = await self.bodies.prepare(generate.group(1), generate.group(2), body)
                try:
                    async with self.upstream.exchange(request, request.rel_url.raw_path_qs, body,
                                                      content_type) as response:
                        return await relay(request, response, self.limits)
                # The client went away: its connection closed (the handler is cancelled), or a write to it
                # failed or timed out first (relay raises ConnectionResetError).
                except (asyncio.CancelledError, ConnectionResetError):
                    if key is not None:
                        self.bodies.abort_later(generate.group(1), key)
                    raise
        except GatewayError as exc:
            return exc.response()

    async def close(self) -> None:
        await self.upstream.close()
        await self.livez.close()


async def serve(host: str, port: int, upstream_address: str, limits: GatewayLimits, key: str | None,
                exit_timeout_s: float) -> None:
    """Serves until SIGTERM or SIGINT, then stops listening and gives requests in flight up to
    exit_timeout_s to finish (Triton, stopped alongside, finishes them first)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gateway = Gateway(upstream_address, limits, key)
    handlers = web.Server(gateway.handle, handler_cancellation=True, access_log=None,
                          keepalive_timeout=limits.idle_timeout_s)
    admission = Admission(limits)
    try:
        if host == "::":   # asyncio would take IPv6 clients only
            listener = await loop.create_server(lambda: Gate(admission, handlers),
                                                sock=tcp_listener(host, port, LISTEN_BACKLOG))
        else:
            listener = await loop.create_server(lambda: Gate(admission, handlers), host, port,
                                                backlog=LISTEN_BACKLOG, reuse_address=True)
    except OSError as exc:
        await gateway.close()
        raise ListenError(f"cannot listen on {host}:{port}: {exc}") from None
    print(f"[gateway] listening on http://{shown(host)}:{port}, forwarding to tritonserver at "
          f"http://{upstream_address}", flush=True)
    await stop.wait()
    listener.close()
    await handlers.shutdown(exit_timeout_s)
    await gateway.close()
