"""bench_serving's requests: prompts of random token ids, none of which an engine of the run sees twice.

The engine's prefix cache answers a prompt it has seen from its KV blocks, in one step instead of a
prefill, so a repeated prompt is not measured like the others. Each concurrency level therefore gets
prompts of its own and the warm-ups others again. Systems with engines of their own (each server, the
in-process engine) get the same prompts, paired request for request. Two systems on one server (gRPC
and the OpenAI frontend) get different `variant`s: the same lengths and output lengths, other ids.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

WARM_UP = -1  # the warm-ups' level
ROUNDS = 4     # of reading a prompt back to its length


@dataclass(frozen=True)
class RequestSets:
    tokenizer: object               # llm_engine.model.tokenizer.Tokenizer: vocab_size, decode, encode
    prompt_range: tuple[int, int]   # min, max prompt tokens
    output_range: tuple[int, int]   # min, max output tokens

    def level(self, index: int, n: int, variant: int = 0) -> list[tuple[str, int]]:
        """The `index`th level's `n` (prompt, max_tokens): the lengths depend on the level alone, the
        prompts' ids on the level and the variant."""
        lengths = random.Random(f"lengths/{index}")
        ids = random.Random(f"ids/{index}/{variant}")
        out = []
        for _ in range(n):
            prompt_len, output_len = lengths.randint(*self.prompt_range), lengths.randint(*self.output_range)
            out.append((self._prompt(prompt_len, ids), output_len))
        return out

    def warm_up(self, n: int, variant: int = 0) -> list[tuple[str, int]]:
        return self.level(WARM_UP, n, variant)

    def _prompt(self, length: int, rng: random.Random) -> str:
        """Text of random ids that the tokenizer reads back as `length` tokens (decoded ids may merge or
        split when read again: the tokens read back are cut or topped up, a few rounds)."""
        vocab, tokens = self.tokenizer.vocab_size, []
        for _ in range(ROUNDS):
            tokens = tokens[:length] + [rng.randrange(10, vocab - 10) for _ in range(length - len(tokens))]
            text = self.tokenizer.decode(tokens)
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            if len(tokens) == length:
                break
        return text
