"""What the engine reports: a RequestDelta per request and step (the one form its outputs take from
the engine to every consumer), the RequestOutput a consumer reads (engine/output_processor.py builds
it from the deltas), and request / engine statistics."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class TopLogprobs:
    """Of one generated token: its rank in the distribution it was drawn from (1: the most likely),
    and the logprobs of that distribution's N most likely tokens by id (N: SamplingParams.logprobs)."""

    rank: int
    top: dict[int, float]


@dataclass(slots=True)
class RequestDelta:
    """What one engine step added to one request: new text, tokens and timings. The deltas of a
    request, concatenated, are its whole output; the last has `finish_reason` set."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[float] | None      # of the new tokens, when requested
    top_logprobs: list[TopLogprobs] | None  # of the new tokens, when requested
    token_times: list[float]          # when each new token was sampled (time.monotonic())
    finish_reason: str | None         # None while running; "stop", "length", "abort" or "error"
    error: str | None = None          # set with finish_reason "error"
    first_scheduled_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0        # prompt tokens served from the prefix cache (last admission)
    # SamplingParams.prompt_logprobs, on the request's first delta: per prompt token, None for the first.
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None
    # vLLM's stop_reason, with finish_reason "stop": the stop string or stop_token_ids id that ended the
    # output; None for the eos (and while running, and for every other finish_reason)
    stop_reason: int | str | None = None
    error_is_input: bool = False      # the error is the request's own (a constraint with no way on)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def after(self, earlier: RequestDelta) -> RequestDelta:
        """This delta and an earlier one of the same request as one (a consumer that fell behind
        takes several steps' deltas at once)."""
        logprobs = None if self.logprobs is None else (earlier.logprobs or []) + self.logprobs
        top = None if self.top_logprobs is None else (earlier.top_logprobs or []) + self.top_logprobs
        first = earlier if earlier.prompt_logprobs is not None else self
        return RequestDelta(self.request_id, earlier.text + self.text, earlier.token_ids + self.token_ids, logprobs,
                            top, earlier.token_times + self.token_times, self.finish_reason, self.error,
                            self.first_scheduled_time, self.finished_time, self.num_cached_tokens,
                            first.prompt_logprobs, first.prompt_top_logprobs, self.stop_reason, self.error_is_input)


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
    """One request's output so far, as a consumer reads it: `delta_text` / `delta_token_ids` are
    new since the consumer's previous output of the request; their concatenation over a stream is
    `text` / `token_ids`.
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
    top_logprobs: list[TopLogprobs] | None = None  # rank and most likely tokens of each output token, when requested
    delta_top_logprobs: list[TopLogprobs] | None = None  # those of the delta's tokens
    # SamplingParams.prompt_logprobs: per prompt token (None for the first), from the first output on
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[TopLogprobs | None] | None = None
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (RequestDelta's)
    error_is_input: bool = False  # RequestDelta's

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


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
