"""The serving loop around an LLMEngine, wherever it runs: AsyncLLMEngine runs it in a thread of the
caller's process, the engine process (engine_process.py) in its main thread.

Only the loop touches the LLMEngine's state. Other threads hand it requests and aborts through an
inbox that it drains before every step; the lock guarding the inbox is never held during a step,
so adding a request never waits for the model. After each pass (the inbox applied, one step run)
the loop hands everything that pass produced to one `deliver(outputs, errors)` call: outputs are
RequestOutputs, errors (request_id, exception) pairs for requests that failed outside the model
step's own handling. A shutdown lets the requests run until a deadline, then aborts the rest.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

from llm_engine.config import EngineConfig
from llm_engine.llm_engine import LLMEngine, Request
from llm_engine.outputs import EngineClosedError, RequestOutput
from llm_engine.scheduler import EngineOverloadedError

logger = logging.getLogger(__name__)

Deliver = Callable[[list[RequestOutput], list[tuple[str, Exception]]], None]


class EngineLoop:
    def __init__(self, engine: LLMEngine, deliver: Deliver) -> None:
        self.engine = engine
        self._deliver = deliver
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[Request | str] = []  # a Request to add, or a request id to abort
        self._num_inbox_adds = 0
        self.num_adds_applied = 0  # requests taken from the inbox so far (read by the loop's thread)
        self._closing = False
        self._deadline = math.inf

    # --- any thread ---------------------------------------------------------------------------

    def add(self, request: Request, max_waiting: int | None = None) -> None:
        """Queue the request for the next pass. Raises EngineClosedError after close(), and
        EngineOverloadedError when `max_waiting` requests wait already (those in the inbox count)."""
        with self._lock:
            if self._closing:
                raise EngineClosedError("the engine is shutting down")
            queued = len(self.engine.scheduler.waiting) + self._num_inbox_adds
            if max_waiting is not None and queued >= max_waiting:
                raise EngineOverloadedError(f"waiting queue is full (max_waiting={max_waiting}); retry later")
            self._inbox.append(request)
            self._num_inbox_adds += 1
            self._wakeup.notify()

    def abort(self, request_id: str) -> None:
        """Abort the request before the next step (no-op if it has finished)."""
        with self._lock:
            self._inbox.append(request_id)
            self._wakeup.notify()

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests; run() returns once the others are done, or `timeout` seconds from now
        (None: no limit), when it aborts what is left."""
        with self._lock:
            self._closing = True
            if timeout is not None:
                self._deadline = time.monotonic() + timeout
            self._wakeup.notify()

    # --- the loop's thread --------------------------------------------------------------------

    def run(self) -> None:
        engine = self.engine
        while True:
            with self._lock:
                while not (self._inbox or self._closing or engine.has_unfinished_requests()):
                    self._wakeup.wait()
                inbox, self._inbox, self._num_inbox_adds = self._inbox, [], 0
                closing, deadline = self._closing, self._deadline
            outputs: list[RequestOutput] = []
            errors: list[tuple[str, Exception]] = []
            for item in inbox:
                self._apply(item, outputs, errors)
            if closing and (not engine.has_unfinished_requests() or time.monotonic() >= deadline):
                outputs += [engine.abort_request(request_id) for request_id in engine.request_ids]
                self._deliver(outputs, errors)
                return
            try:
                outputs += engine.step()
            except Exception as exc:  # a bug outside any one request: fail them all, keep serving
                logger.exception("engine step failed; failing every in-flight request")
                for request_id in engine.request_ids:
                    engine.abort_request(request_id)
                    errors.append((request_id, exc))
            self._deliver(outputs, errors)

    def _apply(self, item: Request | str, outputs: list[RequestOutput], errors: list) -> None:
        if isinstance(item, str):
            out = self.engine.abort_request(item)
            if out is not None:
                outputs.append(out)
            return
        self.num_adds_applied += 1
        try:
            self.engine.enqueue(item)
        except Exception as exc:  # e.g. the queue filled up between the check and now
            errors.append((item.request_id, exc))


def warm_up(engine: LLMEngine) -> None:
    """Prefill, decode and sampling once (the model runner's warm-up compiles every kernel variant and
    captures the CUDA graphs), so no request pays compilation time."""
    runner = engine.model_runner
    if hasattr(runner, "warmup"):
        runner.warmup()
    engine.add_request("warmup", prompt_token_ids=[1, 2, 3, 4],
                       sampling_params={"temperature": 0.0, "max_tokens": 4, "ignore_eos": True})
    while engine.has_unfinished_requests():
        engine.step()


def start_engine(config: EngineConfig) -> LLMEngine:
    """An LLMEngine for config, warmed up; a failure stops what it started (tensor-parallel workers)."""
    engine = LLMEngine(config)
    try:
        warm_up(engine)
    except BaseException:
        engine.close()
        raise
    return engine
