"""A request's token sequence as the scheduler, block manager and model runner see it."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

_seq_counter = itertools.count()


def placeholder_token(row: int) -> int:
    """Stands in token_ids for the token that a launched step samples in row `row` of its sampled
    ids, until those reach the host (async scheduling): the next step reads it on the device."""
    return -1 - row


def placeholder_row(token_id):
    """The sampled-ids row a placeholder stands for (works on numpy arrays too)."""
    return -1 - token_id


class SequenceStatus(enum.Enum):
    WAITING = "waiting"      # queued, or preempted (its KV was dropped and is recomputed)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Prompt plus generated tokens. KV for tokens [0, num_computed_tokens) is in the cache.

    `block_table[i]` is the physical KV block holding tokens [i*block_size, (i+1)*block_size).
    """

    token_ids: list[int]
    sampling_params: Any  # llm_engine.sampling_params.SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at the last admission
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None  # "stop", "length", "abort"
    # vLLM's stop_reason, with finish_reason "stop": the stop string or stop_token_ids id that ended it;
    # None for the eos (and a finished grammar)
    stop_reason: int | str | None = None
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[Any] = field(default_factory=list)  # outputs.TopLogprobs, with output_logprobs
    # SamplingParams.prompt_logprobs: those of prompt tokens 1, 2, ... as far as scored, and the first
    # position not yet scored (kept across preemption, so a recompute scores nothing twice).
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[Any] = field(default_factory=list)
    prompt_logprob_mark: int = 0
    # Chained hashes of the full blocks of token_ids (prefix caching); tokens are only appended,
    # so they stay valid across preemption and are extended, never recomputed.
    block_hashes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprob: float | None = None) -> None:
        self.token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)
