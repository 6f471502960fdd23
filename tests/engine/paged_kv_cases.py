"""Shared by the paged-attention kernel tests: random paged KV caches, dense float64 attention, tolerances."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llm_engine.kernels import quantize_fp8_cache_ref

FP8 = torch.float8_e4m3fn
# Compared in float32. bf16 attention rounds q, k, v and the softmax weights to 8 mantissa bits.
TOLERANCE = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
GQA = [(4, 4), (8, 2), (8, 1)]  # (num_q_heads, num_kv_heads): ratios 1, 4 and 8


@dataclass
class PagedKV:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, cache_dtype, block_size=16) -> PagedKV:
    """Random caches (every slot filled, used or not) and shuffled, padded block tables."""
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 2
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Per-token magnitudes vary so FP8 scales differ from token to token.
    magnitude = torch.rand(*shape[:3], 1, generator=gen) * 2 + 0.1
    k = torch.randn(*shape, generator=gen) * magnitude
    v = torch.randn(*shape, generator=gen) * magnitude
    if cache_dtype == FP8:
        (k_cache, k_scale), (v_cache, v_scale) = quantize_fp8_cache_ref(k), quantize_fp8_cache_ref(v)
    else:
        k_cache, v_cache, k_scale, v_scale = k.to(cache_dtype), v.to(cache_dtype), None, None
    block_ids = torch.randperm(num_blocks, generator=gen)
    # Entries past a sequence's blocks point at other sequences' blocks: reading them is wrong.
    block_tables = torch.randint(0, num_blocks, (len(context_lens), max_blocks), generator=gen)
    start = 0
    for b, n in enumerate(blocks_per_seq):
        block_tables[b, :n] = block_ids[start : start + n]
        start += n
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return PagedKV(to(k_cache), to(v_cache), to(k_scale), to(v_scale),
                   block_tables.to(device=device, dtype=torch.int32),
                   torch.tensor(context_lens, dtype=torch.int32, device=device))


def dense_attention_f64(q, k, v, scale, q_positions):
    """Naive causal attention: q [n, Hq, D], k/v [ctx, Hkv, D] -> [n, Hq, D] in float64."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        scores = q[:, h] @ k[:, h // group].T * scale
        visible = torch.arange(k.shape[0])[None, :] <= torch.as_tensor(q_positions)[:, None]
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[:, h] = scores.softmax(dim=-1) @ v[:, h // group]
    return out


def randn(gen, *shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def assert_close(actual, expected, dtype):
    assert actual.shape == expected.shape
    assert torch.isfinite(actual.float()).all()
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCE[dtype])
