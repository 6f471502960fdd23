"""Structured output's token mask applied to logits, in place: a disallowed token's logit becomes -inf.

The mask is packed as the grammar engine fills it (xgrammar's layout): int32 words [rows, ceil(vocab/32)],
bit j of word w allowing token 32 * w + j; a row of all ones (-1) allows everything. Logits may be wider
than the mask covers (a padded vocabulary): tokens past it are disallowed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import expect_dtype, expect_last_dim_contiguous, expect_launchable, expect_ndim
from llm_engine.kernels.launch_config import launch_params


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] float32, bitmask [rows, words] int32 -> logits, disallowed set to -inf."""
    _check_args(logits, bitmask)
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :logits.shape[1]]
    vocab = logits.shape[1]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    return logits.masked_fill_(~allowed, float("-inf"))


@triton.jit
def _apply_token_bitmask_kernel(logits_ptr, mask_ptr, stride_logits, stride_mask, vocab, words,
                                BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    word = tl.load(mask_ptr + row * stride_mask + cols // 32, mask=in_vocab & (cols // 32 < words), other=0)
    allowed = ((word >> (cols % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_logits + cols, float("-inf"), mask=in_vocab & ~allowed)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] float32, bitmask [rows, words] int32 on the same device -> logits, in place."""
    _check_args(logits, bitmask)
    expect_launchable("logits", logits, "apply_token_bitmask_ref")
    rows, vocab = logits.shape
    if rows and vocab:
        params = launch_params("apply_token_bitmask", logits.device)
        block = min(params["BLOCK"], triton.next_power_of_2(vocab))
        _apply_token_bitmask_kernel[(rows, triton.cdiv(vocab, block))](
            logits, bitmask, logits.stride(0), bitmask.stride(0), vocab, bitmask.shape[1],
            BLOCK=block, num_warps=params["num_warps"])
    return logits


def _check_args(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    expect_ndim("logits", logits, 2, "[rows, vocab]")
    expect_ndim("bitmask", bitmask, 2, "[rows, ceil(vocab / 32)]")
    expect_dtype("logits", logits, (torch.float32,))
    expect_dtype("bitmask", bitmask, (torch.int32,))
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {logits.shape[0]}")
    expect_last_dim_contiguous("logits", logits)
    expect_last_dim_contiguous("bitmask", bitmask)
