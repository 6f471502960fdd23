"""What the engine reports: per-step request outputs and request / engine statistics."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class EngineClosedError(RuntimeError):
    """The engine is shutting down, or gone, and accepts no new requests."""


class RequestFailedError(RuntimeError):
    """A request ended with finish_reason "error" (its batch or its post-processing failed)."""

    def __init__(self, request_id: str, error: str) -> None:
        super().__init__(f"request {request_id!r} failed: {error}")
        self.request_id = request_id
        self.error = error


@dataclass
class RequestStats:
    """Timestamps are time.monotonic() seconds."""

    arrival_time: float
    num_prompt_tokens: int
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (last admission)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_times)

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class RequestOutput:
    """One request's state after a step. `delta_text` / `delta_token_ids` are new since the
    previous output of the same request; their concatenation over a stream is `text` / `token_ids`.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]  # one list shared by all outputs of the request: read-only
    text: str
    delta_text: str
    token_ids: list[int]
    delta_token_ids: list[int]
    finish_reason: str | None  # None while running; "stop", "length", "abort" or "error"
    logprobs: list[float] | None  # logprob of each output token, when requested
    stats: RequestStats
    error: str | None = None  # set with finish_reason "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def following(self, earlier: RequestOutput) -> RequestOutput:
        """This output as if it also carried `earlier`'s deltas (a consumer that fell behind
        takes several steps' outputs as one)."""
        return dataclasses.replace(self, delta_text=earlier.delta_text + self.delta_text,
                                   delta_token_ids=earlier.delta_token_ids + self.delta_token_ids)


@dataclass
class EngineStats:
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_prompt_tokens: int  # prompt tokens computed by prefill chunks (recompute included, cache hits not)
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_generation_tokens: int  # tokens sampled and kept (a token computed after its request ended is not)
    num_async_steps: int = 0  # steps launched before the previous step's sampled tokens reached the host
