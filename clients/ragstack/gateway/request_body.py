"""A request's body, read whole before anything reaches Triton: within max_body_bytes (declared and
as it streams, after aiohttp's decompression), within max_buffered_bytes for all requests together,
without a pause longer than body_timeout_s, and with JSON no deeper than max_json_depth. What Triton is
told the body is comes from the gateway, never the client: a form-urlencoded body would reach
libevhtp's query parser, which crashes on 4 MiB."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from ragstack.gateway import json_depth
from ragstack.gateway.errors import GatewayError
from ragstack.gateway.limits import GatewayLimits

# Triton's binary tensor extension: the body starts with this many bytes of JSON, then raw tensors.
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON, BINARY = "application/json", "application/octet-stream"


class Held:
    """Request body bytes the gateway holds, all requests together."""

    def __init__(self, limits: GatewayLimits):
        self.limit, self.bytes = limits.max_buffered_bytes, 0

    def add(self, size: int) -> None:
        if self.bytes + size > self.limit:
            raise GatewayError(503, f"the gateway holds {self.bytes} bytes of request bodies, its limit "
                                    f"{self.limit} (max_buffered_bytes); retry later", retry_after_s=1, close=True)
        self.bytes += size


@contextlib.asynccontextmanager
async def read(request: web.BaseRequest, limits: GatewayLimits, held: Held) -> AsyncIterator[bytes]:
    """The body, counted in `held` until the block ends."""
    cap = limits.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > cap:
        raise GatewayError(413, f"the request body is {declared} bytes; the limit is {cap} (max_body_bytes)",
                           close=True)
    if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # aiohttp may still send an error response: nothing counts as sent
    chunks, size = [], 0
    try:
        while chunk := await _next_chunk(request, limits):
            held.add(len(chunk))
            size += len(chunk)
            if size > cap:
                raise GatewayError(413, f"the request body is more than {cap} bytes (max_body_bytes), "
                                        "counted as it arrived (chunked or compressed)", close=True)
            chunks.append(chunk)
        # The body once in memory while it is relayed, as `held` counts it: neither the chunks nor a name
        # here keep a second copy (a generate body the handler rewrites would otherwise stay too).
        chunks[:] = [b"".join(chunks)]
        yield chunks.pop()
    finally:
        held.bytes -= size


async def _next_chunk(request: web.BaseRequest, limits: GatewayLimits) -> bytes:
    try:
        return await asyncio.wait_for(request.content.readany(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise GatewayError(408, f"no request body data for {limits.body_timeout_s:g} s (body_timeout_s)",
                           close=True) from None


def check(body: bytes, headers, limits: GatewayLimits) -> str:
    """Refuses JSON nested past the limit; returns the content type to forward the body with."""
    json_part, content_type = body, JSON
    if HEADER_LENGTH in headers:
        value = headers[HEADER_LENGTH]
        if not value.isdigit() or int(value) > len(body):
            raise GatewayError(400, f"{HEADER_LENGTH} {value!r} is not a byte count within the {len(body)}-byte body")
        json_part, content_type = body[:int(value)], BINARY
    found = json_depth.deeper_than(json_part, limits.max_json_depth)
    if found is not None:
        raise GatewayError(400, f"the request's JSON nests {found} levels deep; the limit is "
                                f"{limits.max_json_depth} (max_json_depth)")
    return content_type
