"""Triton's HTTP port behind the gateway: a bounded pool of connections to it, requests sent with the
client's end-to-end headers, and responses relayed to the client as their bytes arrive."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from ragstack.gateway.errors import GatewayError
from ragstack.gateway.limits import GatewayLimits

# RFC 9110 section 7.6.1: meant for one connection only; also those the Connection header names.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"})
# The gateway sends the body it read (whole, decompressed, checked) with headers of its own.
BODY_HEADERS = frozenset({"host", "content-length", "content-type", "content-encoding", "expect"})


def end_to_end(headers, also_drop: frozenset[str] = frozenset()) -> CIMultiDict:
    named = {token.strip().lower() for value in headers.getall("Connection", ()) for token in value.split(",")}
    drop = HOP_BY_HOP | named | also_drop
    return CIMultiDict((name, value) for name, value in headers.items() if name.lower() not in drop)


class Upstream:
    def __init__(self, address: str, limits: GatewayLimits):
        self.address, self.limits = address, limits
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limits.upstream_connections),
            # No read deadline: a generation may run long; the client's going away ends it.
            timeout=aiohttp.ClientTimeout(total=None, connect=limits.upstream_wait_s),
            # Bodies pass as they are (a compressed response stays compressed), and no header is
            # added that the client did not send (aiohttp would ask Triton for gzip).
            auto_decompress=False, skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"))

    @contextlib.asynccontextmanager
    async def exchange(self, request: web.BaseRequest, path_qs: str, body: bytes,
                       content_type: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """Triton's response to `request` sent to `path_qs` with `body`; its headers read."""
        headers = end_to_end(request.headers, BODY_HEADERS)
        if body:
            headers["Content-Type"] = content_type
        try:
            response = await self.session.request(request.method, URL(f"http://{self.address}{path_qs}", encoded=True),
                                                  headers=headers, data=body or None, allow_redirects=False)
        except aiohttp.ConnectionTimeoutError:
            raise GatewayError(503, f"no connection to tritonserver free within {self.limits.upstream_wait_s:g} s "
                                    f"({self.limits.upstream_connections} in use, upstream_connections); retry later",
                               retry_after_s=1) from None
        except aiohttp.ClientError as exc:
            raise GatewayError(502, f"tritonserver at {self.address} did not answer: {exc}") from None
        try:
            yield response
        except BaseException:
            # Closed, not pooled: the closed connection is what makes Triton cancel the request.
            response.close()
            raise
        finally:
            response.release()

    async def close(self) -> None:
        await self.session.close()


async def relay(request: web.BaseRequest, upstream: aiohttp.ClientResponse, limits: GatewayLimits) -> web.StreamResponse:
    """Triton's status, headers and body to the client, each piece as it arrives (SSE events too)."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                  headers=end_to_end(upstream.headers, frozenset({"content-length"})))
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    await response.prepare(request)
    async for chunk in upstream.content.iter_any():
        try:
            await asyncio.wait_for(response.write(chunk), limits.body_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionResetError(f"the client took no data for {limits.body_timeout_s:g} s") from None
    await response.write_eof()
    return response
