"""A client that goes away cancels its work: the work runs beside a watch for ASGI's `http.disconnect`,
and whichever ends first ends the other. Cancelling the work closes its Triton streams (generation.py).

Streamed answers are EventStream responses: the events are sent as they come, and the watch runs from
the first byte to the last, also while no event is due (a request still queued, or in retrieval). A client
whose stream's write has waited write_timeout_s (the socket's buffers full: it reads nothing) is taken as gone
too: its stream would hold a place of max_inflight for as long as it holds its connection. The response is
left unfinished; the socket itself goes once the kernel gives up on it (TCP_USER_TIMEOUT, __main__.listen).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}   # no proxy may hold events back
CLIENT_GONE = 499   # nginx's status for a request whose client went away: nobody reads it


STALL_CHECK_S = 1.0
log = logging.getLogger("ragstack.openai_frontend")


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


class ClientStalled(ClientGone):
    """The client read none of a streamed answer for write_timeout_s."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(work: Awaitable[T], receive: Receive, stalled: Awaitable[None] | None = None) -> T:
    """`work`'s result, unless the client goes away (or `stalled` ends) first."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    stall = asyncio.ensure_future(stalled) if stalled is not None else None
    futures = [future for future in (task, watch, stall) if future is not None]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    if task.cancelled():
        raise ClientStalled if stall is not None and not stall.cancelled() else ClientGone
    return task.result()


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; ClientGone (the work cancelled) if the client goes away first. The request's
    body must have been read."""
    return await _first(work, request.receive)


class EventStream(StreamingResponse):
    """text/event-stream of `events` (whole SSE events, as bytes)."""

    def __init__(self, events: AsyncIterator[bytes], write_timeout_s: float):
        super().__init__(events, headers=SSE_HEADERS, media_type="text/event-stream")
        self.write_timeout_s = write_timeout_s
        self._writing_since: float | None = None   # a write waiting on the client (uvicorn's flow control)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            await _first(self._send_all(send), receive, self._stalled())
        except ClientStalled:
            log.warning("%s: a write waited %g s on a client that reads nothing (write_timeout_s); its stream "
                        "was ended", scope.get("path"), self.write_timeout_s)
            scope.setdefault("state", {}).setdefault("error_status", CLIENT_GONE)
        except (ClientGone, OSError):   # counted as a request the client left (metrics), unless it had failed
            scope.setdefault("state", {}).setdefault("error_status", CLIENT_GONE)

    async def _send_all(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        async with contextlib.aclosing(self.body_iterator) as events:
            async for event in events:
                self._writing_since = loop.time()
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self._writing_since = None
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stalled(self) -> None:
        """Returns once a write has waited write_timeout_s (checked every STALL_CHECK_S: no timer per event)."""
        loop = asyncio.get_running_loop()
        while self._writing_since is None or loop.time() - self._writing_since < self.write_timeout_s:
            await asyncio.sleep(min(STALL_CHECK_S, self.write_timeout_s))
