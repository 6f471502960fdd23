"""A client that goes away cancels its work: the work runs beside a watch for ASGI's `http.disconnect`,
and whichever ends first ends the other. Cancelling the work closes its Triton streams (generation.py).

Streamed answers are EventStream responses: the events are sent as they come, and the watch runs from
the first byte to the last, also while no event is due (a request still queued, or in retrieval).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}   # no proxy may hold events back
CLIENT_GONE = 499   # nginx's status for a request whose client went away: nobody reads it


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(work: Awaitable[T], receive: Receive) -> T:
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in (task, watch):
            future.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; ClientGone (the work cancelled) if the client goes away first. The request's
    body must have been read."""
    return await _first(work, request.receive)


class EventStream(StreamingResponse):
    """text/event-stream of `events` (whole SSE events, as bytes)."""

    def __init__(self, events: AsyncIterator[bytes]):
        super().__init__(events, headers=SSE_HEADERS, media_type="text/event-stream")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            await _first(self._send_all(send), receive)
        except (ClientGone, OSError):   # counted as a request the client left (metrics), unless it had failed
            scope.setdefault("state", {}).setdefault("error_status", CLIENT_GONE)

    async def _send_all(self, send: Send) -> None:
        async with contextlib.aclosing(self.body_iterator) as events:
            async for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
