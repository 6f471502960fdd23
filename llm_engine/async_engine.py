"""Streaming serving in one process: a background thread runs the EngineLoop (engine_loop.py),
each request is an async iterator (streams.py).

Other threads validate a request (so bad input raises at once, in the caller) and hand it, or an
abort, to the loop, which applies them before its next step; outputs go back to the caller's event
loop with call_soon_threadsafe. EngineProcessClient (engine_client.py) offers the same interface
over an engine in a process of its own.
"""
from __future__ import annotations

import threading
from typing import AsyncIterator

from llm_engine.config import EngineConfig
from llm_engine.engine_loop import EngineLoop
from llm_engine.llm_engine import LLMEngine
from llm_engine.outputs import EngineClosedError, EngineStats, RequestOutput
from llm_engine.sampling_params import SamplingParams
from llm_engine.streams import OutputStreams

__all__ = ["AsyncLLMEngine", "EngineClosedError"]


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._streams = OutputStreams(self.abort)
        self._loop = EngineLoop(engine, self._streams.deliver)
        self._thread = threading.Thread(target=self._loop.run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        return cls(LLMEngine(config))

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None,
                    prompt_token_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """Queue a request (inside a running event loop); iterate the result for its outputs
        (`delta_text` per new token).

        Raises ValueError for bad input, EngineOverloadedError when the waiting queue is full,
        EngineClosedError after shutdown. Leaving the iteration early (break, cancellation)
        aborts the request. A failed request raises RequestFailedError from the iterator.
        """
        request = self.engine.prepare_request(request_id, prompt, sampling_params, prompt_token_ids)
        queue = self._streams.open(request_id)
        try:
            self._loop.add(request, self.engine.config.max_waiting)
        except BaseException:
            self._streams.discard(request_id)
            raise
        return self._streams.iterate(request_id, queue)

    def abort(self, request_id: str) -> None:
        """Abort the request (no-op if finished); its stream ends with finish_reason "abort"."""
        self._loop.abort(request_id)

    def get_stats(self) -> EngineStats:
        return self.engine.get_stats()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None:
        no limit), abort the rest, stop the loop thread and close the engine."""
        self._loop.close(timeout)
        self._thread.join()
        self.engine.close()
