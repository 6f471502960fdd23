"""A request's RequestOutputs rebuilt from its RequestDeltas, where a consumer reads them: LLMEngine's
step() for its callers, and each stream of an EngineClient (streams.py) in the consumer's event loop.
"""
from __future__ import annotations

from llm_engine.engine.input_processor import EngineRequest
from llm_engine.outputs import RequestDelta, RequestOutput, RequestStats


class OutputAssembler:
    """One request's output so far: each delta applied gives the RequestOutput a consumer reads."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] | None = None
        self.top_logprobs: list = []
        self.prompt_logprobs: list | None = None
        self.prompt_top_logprobs: list | None = None
        self.stats = RequestStats(arrival_time=request.arrival_time, num_prompt_tokens=len(request.prompt_token_ids))

    def apply(self, delta: RequestDelta) -> RequestOutput:
        self.text += delta.text
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        if delta.top_logprobs is not None:
            self.top_logprobs += delta.top_logprobs
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs, self.prompt_top_logprobs = delta.prompt_logprobs, delta.prompt_top_logprobs
        stats = self.stats
        stats.token_times += delta.token_times
        if stats.first_token_time is None and stats.token_times:
            stats.first_token_time = stats.token_times[0]
        stats.first_scheduled_time = delta.first_scheduled_time
        stats.finished_time = delta.finished_time
        stats.num_cached_tokens = delta.num_cached_tokens
        return RequestOutput(
            request_id=delta.request_id, prompt=self.request.prompt, prompt_token_ids=self.request.prompt_token_ids,
            text=self.text, delta_text=delta.text, token_ids=list(self.token_ids), delta_token_ids=delta.token_ids,
            finish_reason=delta.finish_reason, logprobs=None if self.logprobs is None else list(self.logprobs),
            stats=stats, error=delta.error,
            top_logprobs=None if delta.top_logprobs is None else list(self.top_logprobs),
            delta_top_logprobs=delta.top_logprobs, prompt_logprobs=self.prompt_logprobs,
            prompt_top_logprobs=self.prompt_top_logprobs, stop_reason=delta.stop_reason,
            error_is_input=delta.error_is_input)
