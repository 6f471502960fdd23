"""Whether a request may join the waiting queue: the one place where max_waiting is decided, for
every way in (LLMEngine.add_request, and EngineClient.add_request for the engine in a thread or in a
process of its own). The caller counts the requests waiting, those on their way to the engine included."""
from __future__ import annotations

from llm_engine.errors import EngineOverloadedError


def admit(num_waiting: int, max_waiting: int | None) -> None:
    """Raises EngineOverloadedError when `max_waiting` requests wait already (None: no bound)."""
    if max_waiting is not None and num_waiting >= max_waiting:
        raise EngineOverloadedError(f"waiting queue is full (max_waiting={max_waiting}); retry later")
