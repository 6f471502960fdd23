"""EngineClient: what a server needs of an engine, wherever the engine runs: requests in, each an
async iterator of its RequestOutputs; aborts; stats; shutdown. AsyncLLMEngine (async_engine.py) runs
the engine in a thread of this process, EngineProcessClient (process_client.py) in a process of its own.

The front half is shared and stays in the caller's process: each request is validated and tokenized
here (input_processor.py: bad input raises at once in add_request), admitted against max_waiting
(admission.py; the waiting count is the engine's latest plus the requests on their way to it), and
handed to the engine by the subclass. The engine's loop answers each pass with a StepReport
(engine_loop.py), which `_take` hands to the request streams (streams.py) and whose stats
get_stats() returns without a round trip.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from abc import ABC, abstractmethod
from typing import AsyncIterator

from llm_engine.config import EngineConfig
from llm_engine.engine.admission import admit
from llm_engine.engine.engine_loop import StepReport
from llm_engine.engine.input_processor import EngineRequest, InputProcessor
from llm_engine.engine.streams import OutputStreams
from llm_engine.errors import EngineClosedError, EngineDeadError
from llm_engine.outputs import EngineStats, RequestOutput
from llm_engine.sampling_params import SamplingParams


class EngineClient(ABC):
    def __init__(self, config: EngineConfig, tokenizer, stats: EngineStats) -> None:
        self.config = config
        self.processor = InputProcessor(tokenizer, config.max_model_len, config.model_config.vocab_size)
        self._lock = threading.Lock()
        self._streams = OutputStreams(self.abort)
        self._stats = stats
        self._closing = False
        self._failure: str | None = None  # why the engine is gone: every later request is refused with it
        self._adds_sent = 0
        self._adds_taken = 0
        self._last_report = time.monotonic()

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None,
                    prompt_token_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """Queue a request (inside a running event loop); iterate the result for its outputs
        (`delta_text` per new token).

        Raises ValueError for bad input, EngineOverloadedError when the waiting queue is full,
        EngineClosedError after shutdown (EngineDeadError once the engine process is gone).
        Leaving the iteration early (break, cancellation) aborts the request. A failed request
        raises RequestFailedError from the iterator.
        """
        request = self.processor.process(request_id, prompt, sampling_params, prompt_token_ids)
        queue = self._streams.open(request)
        try:
            with self._lock:
                if self._failure is not None:
                    raise EngineDeadError(self._failure)
                if self._closing:
                    raise EngineClosedError("the engine is shutting down")
                admit(self._stats.num_waiting + self._adds_sent - self._adds_taken, self.config.max_waiting)
                self._adds_sent += 1
            self._submit(request)
        except BaseException:
            self._streams.discard(request_id)
            raise
        return self._streams.iterate(request, queue)

    def abort(self, request_id: str) -> None:
        """Abort the request (no-op if finished); its stream ends with finish_reason "abort"."""
        if self._streams.is_open(request_id):
            self._send_abort(request_id)

    def get_stats(self) -> EngineStats:
        """The stats after the engine's latest step."""
        with self._lock:
            return self._stats

    def seconds_since_report(self) -> float:
        """Since the engine's loop last reported: it reports after every step and every
        engine_loop.HEARTBEAT_S when idle, so a value far above both means it is stuck."""
        with self._lock:
            return time.monotonic() - self._last_report

    @property
    def failure(self) -> str | None:
        """Why the engine is gone (every request is refused with it), or None while it serves."""
        with self._lock:
            return self._failure

    @abstractmethod
    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None: no
        limit), abort the rest, and stop the engine."""

    # --- for the subclasses -------------------------------------------------------------------

    @abstractmethod
    def kill(self, reason: str) -> None:
        """End a stuck engine at once: its open requests fail with EngineDeadError giving `reason`, as
        do later ones."""

    @abstractmethod
    def _submit(self, request: EngineRequest) -> None:
        """Hand an admitted request to the engine."""

    @abstractmethod
    def _send_abort(self, request_id: str) -> None:
        """Have the engine abort the request before its next step."""

    def _take(self, report: StepReport) -> None:
        """Any thread: a pass of the engine's loop, its deltas to their streams."""
        with self._lock:
            self._stats = report.stats
            self._adds_taken = report.num_adds_taken
            self._last_report = time.monotonic()
        self._streams.deliver(report.deltas, report.errors)

    def _fail(self, failure: str) -> None:
        """The engine is gone: every open stream ends with EngineDeadError(failure), later requests too."""
        with self._lock:
            self._failure = failure
            self._stats = dataclasses.replace(self._stats, kv_blocks_used=0, kv_blocks_free=self._stats.kv_blocks_total,
                                              num_running=0, num_waiting=0)
        self._streams.fail_all(lambda: EngineDeadError(failure))

    def _begin_shutdown(self) -> bool:
        """Refuse new requests from now on; True for the first call."""
        with self._lock:
            first, self._closing = not self._closing, True
        return first
