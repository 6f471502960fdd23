"""bench_serving's request sets: no prompt repeats across levels, warm-ups and the variants of one server
(the engine's prefix cache would serve a repeat), and variants pair by length."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.serving_requests import RequestSets
from llm_engine.model.tokenizer import Tokenizer

TINY = Path(__file__).resolve().parents[2] / "model_repository" / "llm" / "1" / "tiny-qwen2"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(TINY)


@pytest.fixture(scope="module")
def sets(tokenizer):
    return RequestSets(tokenizer, (16, 48), (4, 9))


def test_no_prompt_repeats_across_levels_warm_ups_and_variants(sets, tokenizer):
    groups = [sets.level(i, n, v) for i, n in enumerate((4, 12, 20)) for v in (0, 1)]
    groups += [sets.warm_up(2), sets.warm_up(8, variant=1)]
    # the prefix cache matches whole blocks from the first token on: no two prompts share their first 16 tokens
    heads = [tuple(tokenizer.encode(prompt)[:16]) for group in groups for prompt, _ in group]
    assert len(set(heads)) == len(heads)


def test_variants_pair_by_length_and_levels_are_reproducible(sets, tokenizer):
    first, other = sets.level(2, 10), sets.level(2, 10, variant=1)
    assert [o for _, o in first] == [o for _, o in other]
    lengths = [[len(tokenizer.encode(p, add_special_tokens=False)) for p, _ in group] for group in (first, other)]
    # read back to the drawn length, or within 2 tokens (decoded ids merge or split when read again)
    assert all(abs(a - b) <= 4 for a, b in zip(*lengths))
    assert all(14 <= n <= 50 for n in lengths[0] + lengths[1])
    assert all(4 <= o <= 9 for _, o in first)
    assert sets.level(2, 10) == first
