"""The engine in a thread of this process: an EngineClient (client.py) whose engine loop
(engine_loop.py) runs in a background thread. EngineProcessClient (process_client.py) is the same
interface over an engine in a process of its own."""
from __future__ import annotations

import threading

from llm_engine.config import EngineConfig
from llm_engine.engine.client import EngineClient
from llm_engine.engine.engine_loop import EngineLoop
from llm_engine.engine.input_processor import EngineRequest
from llm_engine.engine.llm_engine import LLMEngine


class AsyncLLMEngine(EngineClient):
    def __init__(self, engine: LLMEngine) -> None:
        super().__init__(engine.config, engine.tokenizer, engine.get_stats())
        self.engine = engine
        self._loop = EngineLoop(engine, self._take)
        self._thread = threading.Thread(target=self._loop.run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLMEngine:
        return cls(LLMEngine(config))

    def _submit(self, request: EngineRequest) -> None:
        self._loop.add(request)

    def _send_abort(self, request_id: str) -> None:
        self._loop.abort(request_id)

    def kill(self, reason: str) -> None:
        """A thread cannot be killed: the loop is left where it is stuck, its requests fail."""
        self._fail(f"the engine loop in this process is stuck: {reason}")

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None:
        no limit), abort the rest, stop the loop thread and close the engine."""
        self._begin_shutdown()
        self._loop.close(timeout)
        self._thread.join()
        self.engine.close()
