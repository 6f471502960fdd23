"""Request validation and tokenization: prompt and sampling parameters in, an EngineRequest out.

It needs only the tokenizer and two limits, no model: LLMEngine runs it for its own requests, and
every EngineClient (client.py) runs it in the serving process, so bad input
raises at once in the caller and only validated requests cross to the engine. Safe from any thread.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from llm_engine.sampling_params import SamplingParams


@dataclass
class EngineRequest:
    """A validated request, its prompt tokenized and max_tokens filled in."""

    request_id: str
    prompt: str | None            # the text, when the prompt was given as text
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float           # time.monotonic() (one clock for every process of the host)


class InputProcessor:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size  # logits width; ids at or above it are invalid
        # A prompt's ids must also be the tokenizer's (vLLM's rule): checkpoints pad the embedding past it.
        self.prompt_vocab_size = min(vocab_size, tokenizer.vocab_size)

    def process(self, request_id: str, prompt: str | list[int] | None = None,
                sampling_params: SamplingParams | dict | None = None,
                prompt_token_ids: list[int] | None = None,
                arrival_time: float | None = None) -> EngineRequest:
        """Raises ValueError naming the field, the value and the limit."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        params = _resolve_params(sampling_params)
        text = prompt if isinstance(prompt, str) else None
        ids = self._prompt_ids(prompt, prompt_token_ids)
        if params.truncate_prompt_tokens is not None:
            keep = self.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
            if len(ids) > keep:
                ids, text = ids[-keep:], None  # the text no longer says what the model sees

        limit = self.max_model_len
        n = len(ids)
        if n >= limit:
            raise ValueError(f"prompt has {n} tokens; it must be shorter than max_model_len={limit} "
                             "to leave room for at least one output token")
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=limit - n)
        elif n + params.max_tokens > limit:
            raise ValueError(f"max_tokens must be <= {limit - n} (max_model_len={limit} minus {n} "
                             f"prompt tokens), got {params.max_tokens}")
        for name, named in (("stop_token_ids", params.stop_token_ids),
                            ("logit_bias token ids", params.logit_bias or ()),
                            ("allowed_token_ids", params.allowed_token_ids or ())):
            if named and max(named) >= self.vocab_size:
                raise ValueError(f"{name} must be < vocab size {self.vocab_size}, got {max(named)}")
        if params.allowed_token_ids and params.min_tokens:
            masked = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.tokenizer.eos_token_ids))
            if set(params.allowed_token_ids) <= masked:
                raise ValueError(f"allowed_token_ids holds only end-of-sequence or stop ids, which min_tokens="
                                 f"{params.min_tokens} forbids: no token could be picked")
        return EngineRequest(request_id, text, ids, params, arrival)

    def _prompt_ids(self, prompt, prompt_token_ids) -> list[int]:
        if prompt_token_ids is None:
            if isinstance(prompt, str):
                if not prompt:
                    raise ValueError("prompt must not be empty")
                prompt_token_ids = self.tokenizer.encode(prompt)
            elif prompt is None:
                raise ValueError("a prompt (text or token ids) or prompt_token_ids is required")
            else:
                prompt_token_ids = prompt
        if isinstance(prompt_token_ids, (str, bytes)) or not hasattr(prompt_token_ids, "__len__"):
            raise ValueError(f"prompt token ids must be a list of ints, got {type(prompt_token_ids).__name__}")
        ids = list(prompt_token_ids)
        if not ids:
            raise ValueError("prompt must not be empty (0 tokens)")
        if not all(isinstance(t, int) for t in ids):
            raise ValueError("prompt token ids must all be ints")
        if min(ids) < 0 or max(ids) >= self.prompt_vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.prompt_vocab_size}), got min {min(ids)}, "
                             f"max {max(ids)} (ids the tokenizer and the model both have)")
        return ids


def _resolve_params(sampling_params) -> SamplingParams:
    if sampling_params is None:
        return SamplingParams()
    if isinstance(sampling_params, dict):
        return SamplingParams.from_dict(sampling_params)
    if isinstance(sampling_params, SamplingParams):
        return dataclasses.replace(sampling_params)  # own copy, re-validated; max_tokens may be filled in
    raise ValueError(f"sampling_params must be SamplingParams or a dict, got {type(sampling_params).__name__}")
