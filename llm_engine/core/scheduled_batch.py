"""What the scheduler hands the model runner for one engine step."""
from __future__ import annotations

from dataclasses import dataclass, field

from llm_engine.core.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One step: each sequence computes tokens [num_computed_tokens, num_computed_tokens + num_new_tokens).

    Block tables already cover those tokens. A sequence whose chunk reaches the end of its known
    tokens is sampled (`sample[i]`); a partial prefill chunk is not. The runner writes the chunk's
    KV into the cache and returns logits for the sampled sequences, in batch order.
    `prompt_rows` (batch index, first position, count): the prompt positions whose logits score the
    next prompt token (SamplingParams.prompt_logprobs), each run within its sequence's chunk.
    """

    seqs: list[Sequence]
    num_new_tokens: list[int]
    sample: list[bool]
    prompt_rows: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.num_new_tokens)
