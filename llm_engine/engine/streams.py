"""The consumers' side of an engine client: one asyncio queue per request, fed with RequestDeltas
from the thread that produces them (AsyncLLMEngine's loop thread, the engine process's reader
thread) with call_soon_threadsafe, one call per event loop for all it hands over at once, and read
as an async iterator of RequestOutputs that merges the deltas that queued up behind a slow consumer.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Callable

from llm_engine.engine.input_processor import EngineRequest
from llm_engine.engine.output_processor import OutputAssembler
from llm_engine.errors import RequestRefusedError
from llm_engine.outputs import RequestDelta, RequestOutput


class OutputStreams:
    def __init__(self, abort: Callable[[str], None]) -> None:
        """`abort(request_id)` frees a request whose consumer left (or whose event loop closed)."""
        self._abort = abort
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}

    def open(self, request: EngineRequest) -> asyncio.Queue:
        """A stream for the request, read in the running event loop; ValueError if the id is in use."""
        stream = (asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            if request.request_id in self._streams:
                raise ValueError(f"request_id {request.request_id!r} is already in use")
            self._streams[request.request_id] = stream
        return stream[1]

    def is_open(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._streams

    def discard(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def deliver(self, deltas: list[RequestDelta], errors: list[tuple[str, BaseException]] = ()) -> None:
        """Any thread: each delta to its request's stream (a finished one ends it), and each
        (request_id, exception) ends that stream by raising the exception in its iterator."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        with self._lock:
            for delta in deltas:
                rid = delta.request_id
                stream = self._streams.pop(rid, None) if delta.finished else self._streams.get(rid)
                if stream is not None:
                    batches.setdefault(stream[0], []).append((stream[1], delta, rid, delta.finished))
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

    async def iterate(self, request: EngineRequest, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        """The request's outputs until its last; RequestFailedError for one that failed. Leaving the
        iteration early (break, cancellation) aborts the request."""
        assembler = OutputAssembler(request)
        done = False
        try:
            while not done:
                item = await queue.get()
                # Deltas that queued up while the consumer was busy go out as one: a slow consumer
                # (a response per output over IPC) then falls no further behind.
                while not queue.empty() and isinstance(item, RequestDelta) and not item.finished:
                    following = queue.get_nowait()
                    item = following.after(item) if isinstance(following, RequestDelta) else following
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                out = assembler.apply(item)
                if out.error is not None:
                    raise RequestRefusedError.of(request.request_id, out.error, out.error_is_input)
                yield out
        finally:
            if not done:  # the consumer left early: free the request's resources
                self._abort(request.request_id)


def _put_all(items) -> None:
    for queue, item, _, _ in items:
        queue.put_nowait(item)
