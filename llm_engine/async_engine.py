"""Streaming serving: one background thread steps the engine, each request is an async iterator.

Only the engine thread touches the LLMEngine's state. Other threads validate a request (so bad
input raises at once, in the caller) and hand it, or an abort, over through an inbox that the
engine thread drains before every step; the lock guarding the inbox is never held during a step,
so adding a request never waits for the model. Outputs go back to the caller's event loop with
call_soon_threadsafe.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator

from llm_engine.config import EngineConfig
from llm_engine.llm_engine import LLMEngine, Request
from llm_engine.outputs import RequestFailedError, RequestOutput
from llm_engine.sampling_params import SamplingParams
from llm_engine.scheduler import EngineOverloadedError

logger = logging.getLogger(__name__)


class EngineClosedError(RuntimeError):
    """The engine is shutting down and accepts no new requests."""


@dataclass(eq=False)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue  # RequestOutput items, or an exception that ends the stream


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[Request | str] = []  # a Request to add, or a request id to abort
        self._num_inbox_adds = 0
        self._streams: dict[str, _Stream] = {}
        self._closing = False
        self._deadline = math.inf
        self._thread = threading.Thread(target=self._run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        return cls(LLMEngine(config))

    # --- caller side (any thread; add_request inside a running event loop) --------------------

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None,
                    prompt_token_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """Queue a request; iterate the result for its outputs (`delta_text` per new token).

        Raises ValueError for bad input, EngineOverloadedError when the waiting queue is full,
        EngineClosedError after shutdown. Leaving the iteration early (break, cancellation)
        aborts the request. A failed request raises RequestFailedError from the iterator.
        """
        loop = asyncio.get_running_loop()
        request = self.engine.prepare_request(request_id, prompt, sampling_params, prompt_token_ids)
        stream = _Stream(loop, asyncio.Queue())
        max_waiting = self.engine.config.max_waiting
        with self._lock:
            if self._closing:
                raise EngineClosedError("the engine is shutting down")
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            queued = len(self.engine.scheduler.waiting) + self._num_inbox_adds
            if max_waiting is not None and queued >= max_waiting:
                raise EngineOverloadedError(
                    f"waiting queue is full (max_waiting={max_waiting}); retry later")
            self._streams[request_id] = stream
            self._inbox.append(request)
            self._num_inbox_adds += 1
            self._wakeup.notify()
        return self._iterate(request_id, stream.queue)

    def abort(self, request_id: str) -> None:
        """Abort the request (no-op if finished); its stream ends with finish_reason "abort"."""
        with self._lock:
            self._inbox.append(request_id)
            self._wakeup.notify()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None:
        no limit), abort the rest, stop the loop thread and close the engine."""
        with self._lock:
            self._closing = True
            if timeout is not None:
                self._deadline = time.monotonic() + timeout
            self._wakeup.notify()
        self._thread.join()
        self.engine.close()

    async def _iterate(self, request_id: str, queue: asyncio.Queue) -> AsyncIterator[RequestOutput]:
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
                self.abort(request_id)

    # --- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._lock:
                while not (self._inbox or self._closing or engine.has_unfinished_requests()):
                    self._wakeup.wait()
                inbox, self._inbox, self._num_inbox_adds = self._inbox, [], 0
                closing, deadline = self._closing, self._deadline
            for item in inbox:
                self._apply(item)
            if closing and (not engine.has_unfinished_requests() or time.monotonic() >= deadline):
                for request_id in engine.request_ids:
                    self._deliver(engine.abort_request(request_id))
                return
            try:
                outputs = engine.step()
            except Exception as exc:  # a bug outside any one request: fail them all, keep serving
                logger.exception("engine step failed; failing every in-flight request")
                for request_id in engine.request_ids:
                    engine.abort_request(request_id)
                    self._deliver_error(request_id, exc)
                continue
            for out in outputs:
                self._deliver(out)

    def _apply(self, item: Request | str) -> None:
        if isinstance(item, str):
            out = self.engine.abort_request(item)
            if out is not None:
                self._deliver(out)
            return
        try:
            self.engine.enqueue(item)
        except Exception as exc:  # e.g. the queue filled up between the check and now
            self._deliver_error(item.request_id, exc)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.pop(out.request_id) if out.finished else self._streams.get(out.request_id)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            if not out.finished:
                self.engine.abort_request(out.request_id)
                with self._lock:
                    self._streams.pop(out.request_id, None)

    def _deliver_error(self, request_id: str, exc: Exception) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)
        except RuntimeError:
            pass  # the caller's event loop is closed; there is no one to tell
