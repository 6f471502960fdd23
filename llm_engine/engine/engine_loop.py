"""The serving loop around an LLMEngine, wherever it runs: AsyncLLMEngine runs it in a thread of the
caller's process, the engine process (engine_process.py) in its main thread.

Only the loop touches the LLMEngine's state. Other threads hand it requests and aborts through an
inbox that it drains before every step; the lock guarding the inbox is never held during a step,
so adding a request never waits for the model. After each pass (the inbox applied, one step run)
the loop hands everything that pass produced to one `deliver(StepReport)` call; an idle loop reports
every HEARTBEAT_S, so a client that hears nothing for longer knows the loop is stuck (a hung step, a
stopped process). A shutdown lets the requests run until a deadline, then aborts the rest.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from llm_engine.engine.input_processor import EngineRequest
from llm_engine.outputs import EngineStats, RequestDelta

if TYPE_CHECKING:  # the clients import StepReport from here: they need no model code
    from llm_engine.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # an idle loop's report interval


@dataclass
class StepReport:
    """What one pass of the loop produced, for the clients (engine/client.py)."""

    deltas: list[RequestDelta]
    errors: list[tuple[str, BaseException]]  # requests that failed outside the step's own handling
    stats: EngineStats                       # after the pass
    num_adds_taken: int                      # requests taken from the inbox so far (admission counts them)


class EngineLoop:
    def __init__(self, engine: LLMEngine, deliver: Callable[[StepReport], None]) -> None:
        self.engine = engine
        self._deliver = deliver
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[EngineRequest | str] = []  # a request to add, or a request id to abort
        self._num_adds_taken = 0
        self._closing = False
        self._deadline = math.inf

    # --- any thread ---------------------------------------------------------------------------

    def add(self, request: EngineRequest) -> None:
        """Queue an admitted request for the next pass (the clients refuse new ones once they shut
        down; one admitted before runs until the shutdown's deadline like the others)."""
        with self._lock:
            self._inbox.append(request)
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
                if not (self._inbox or self._closing or engine.has_unfinished_requests()):
                    self._wakeup.wait(HEARTBEAT_S)
                inbox, self._inbox = self._inbox, []
                closing, deadline = self._closing, self._deadline
            deltas: list[RequestDelta] = []
            errors: list[tuple[str, BaseException]] = []
            for item in inbox:
                self._apply(item, deltas, errors)
            if closing and (not engine.has_unfinished_requests() or time.monotonic() >= deadline):
                deltas += [engine.abort(request_id) for request_id in engine.request_ids]
                self._report(deltas, errors)
                return
            try:
                deltas += engine.step_deltas()
                errors += engine.take_failures()
            except Exception as exc:  # a bug outside any one request: fail them all, keep serving
                logger.exception("engine step failed; failing every in-flight request")
                for request_id in engine.request_ids:
                    engine.abort(request_id)
                    errors.append((request_id, exc))
            self._report(deltas, errors)

    def _report(self, deltas: list[RequestDelta], errors: list[tuple[str, BaseException]]) -> None:
        self._deliver(StepReport(deltas, errors, self.engine.get_stats(), self._num_adds_taken))

    def _apply(self, item: EngineRequest | str, deltas: list[RequestDelta], errors: list) -> None:
        if isinstance(item, str):
            delta = self.engine.abort(item)
            if delta is not None:
                deltas.append(delta)
            return
        self._num_adds_taken += 1
        try:
            self.engine.enqueue(self.engine.make_request(item))
        except Exception as exc:  # e.g. more KV blocks than the pool holds
            errors.append((item.request_id, exc))
