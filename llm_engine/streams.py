"""The consumers' side of an async engine: one asyncio queue per request, fed from the thread that
produces the outputs (AsyncLLMEngine's loop thread, the engine process's reader thread) with
call_soon_threadsafe, one call per event loop for all it hands over at once, and read as an async
iterator that merges the outputs that queued up behind a slow consumer.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Callable

from llm_engine.outputs import RequestFailedError, RequestOutput


class OutputStreams:
    def __init__(self, abort: Callable[[str], None]) -> None:
        """`abort(request_id)` frees a request whose consumer left (or whose event loop closed)."""
        self._abort = abort
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    def open(self, request_id: str) -> asyncio.Queue:
        """A stream for the request, read in the running event loop; ValueError if the id is in use."""
        stream = (asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._streams[request_id] = stream
        return stream[1]

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def deliver(self, outputs: list[RequestOutput], errors: list[tuple[str, BaseException]] = ()) -> None:
        """Any thread: each output to its request's stream (a finished one ends it), and each
        (request_id, exception) ends that stream by raising the exception in its iterator."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        with self._lock:
            for out in outputs:
                rid = out.request_id
                stream = self._streams.pop(rid, None) if out.finished else self._streams.get(rid)
                if stream is not None:
                    batches.setdefault(stream[0], []).append((stream[1], out, rid, out.finished))
            for rid, exc in errors:
                stream = self._streams.pop(rid, None)
                if stream is not None:
                    batches.setdefault(stream[0], []).append((stream[1], exc, rid, True))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the consumer's event loop is closed: nobody is listening any more
                for _, _, rid, finished in items:
                    if not finished:
                        self.discard(rid)
                        self._abort(rid)

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """End every open stream with an error of its own."""
        with self._lock:
            request_ids = list(self._streams)
        self.deliver([], [(rid, make_error()) for rid in request_ids])

    async def iterate(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        """The request's outputs until its last; RequestFailedError for one that failed. Leaving the
        iteration early (break, cancellation) aborts the request."""
        done = False
        try:
            while not done:
                item = await queue.get()
                # Outputs that queued up while the consumer was busy go out as one: a slow
                # consumer (a response per output over IPC) then falls no further behind.
                while not queue.empty() and isinstance(item, RequestOutput) and not item.finished:
                    following = queue.get_nowait()
                    item = following.following(item) if isinstance(following, RequestOutput) else following
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                if item.error is not None:
                    raise RequestFailedError(request_id, item.error)
                yield item
        finally:
            if not done:  # the consumer left early: free the request's resources
                self._abort(request_id)


def _put_all(items) -> None:
    for queue, item, _, _ in items:
        queue.put_nowait(item)
