"""The structured-output token mask on logits, against its torch reference and an unpacked mask built
here bit by bit, on fresh random inputs: vocabularies that do and do not fill their last word, logits
wider than the mask (a padded vocabulary), all-allowed and all-but-one rows."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kernels import apply_token_bitmask, apply_token_bitmask_ref


def random_case(gen, rows: int, vocab: int, words: int, device):
    logits = torch.randn(rows, vocab, generator=gen).to(device)
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[0] = -1  # everything allowed
    if rows > 1:
        bitmask[1] = 0
        bitmask[1, 0] = 1 << 3  # token 3 alone
    return logits, bitmask.to(device)


def expected(logits, bitmask):
    allowed = torch.zeros(logits.shape, dtype=torch.bool)
    words = bitmask.cpu().tolist()
    for r in range(logits.shape[0]):
        for t in range(min(logits.shape[1], 32 * len(words[r]))):
            allowed[r, t] = bool((words[r][t // 32] >> (t % 32)) & 1)
    return torch.where(allowed.to(logits.device), logits, torch.full_like(logits, float("-inf")))


@pytest.mark.parametrize("rows, vocab, words", [(1, 32, 1), (3, 100, 4), (5, 1000, 32), (4, 130, 4), (2, 4099, 129)])
def test_matches_the_reference_and_the_bits(gen, device, rows, vocab, words):
    logits, bitmask = random_case(gen, rows, vocab, words, device)
    want = expected(logits.clone(), bitmask)
    assert torch.equal(apply_token_bitmask_ref(logits.clone(), bitmask), want)
    got = apply_token_bitmask(logits.clone(), bitmask)
    assert torch.equal(got, want)
    if rows > 1:
        assert torch.isinf(got[1]).sum() == vocab - 1 and got[1, 3] == logits[1, 3]


def test_contract_violations(device):
    logits = torch.zeros(2, 64, device=device)
    with pytest.raises(ValueError, match="bitmask has 1 rows, logits 2"):
        apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="bitmask must have dtype"):
        apply_token_bitmask(logits, torch.zeros(2, 2, dtype=torch.int64, device=device))
