"""Paged decode attention (split KV, FP8 caches, GQA) against its torch reference."""
from __future__ import annotations

import pytest
import torch
from paged_kv_cases import FP8, GQA, assert_close, make_paged_kv, randn
from tiers import FLOAT32_IN_FULL_RUN, in_full_run

from llm_engine.kernels import (
    paged_decode_attention,
    paged_decode_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    rotary_and_write_kv,
    rotary_and_write_kv_ref,
)
from llm_engine.kernels.launch_config import override_launch_params
from llm_engine.model.layers.rotary_embedding import compute_cos_sin_cache

# --- paged decode attention -------------------------------------------------------------------

DECODE_CONTEXTS = [[1, 15, 16, 17], [47, 80], [33]]


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, *in_full_run(128)])
@pytest.mark.parametrize("context_lens", DECODE_CONTEXTS[:2])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_decode_matches_ref(gen, device, dtype, num_q_heads, num_kv_heads, head_dim, context_lens, num_splits):
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, dtype)
    q = randn(gen, len(context_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5)
    out = paged_decode_attention(*args, num_splits=num_splits)
    assert out.dtype == dtype
    assert_close(out, paged_decode_attention_ref(*args), dtype)


@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("num_splits", [1, 4, 11])  # 11: the merge loops over two chunks, the last all empty
def test_decode_other_block_sizes(gen, device, block_size, num_splits):
    context_lens = [block_size - 1, block_size, block_size + 1, 3 * block_size + 5]
    kv = make_paged_kv(gen, device, context_lens, 2, 64, torch.float32, block_size=block_size)
    q = randn(gen, len(context_lens), 4, 64, dtype=torch.float32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    assert_close(paged_decode_attention(*args, num_splits=num_splits), paged_decode_attention_ref(*args), torch.float32)


@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("head_dim", [64, *in_full_run(128)])
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16, torch.float32])   # a model's dtype
def test_decode_fp8_cache_matches_ref(gen, device, num_q_heads, num_kv_heads, head_dim, num_splits, q_dtype):
    context_lens = DECODE_CONTEXTS[0] if num_splits == 1 else DECODE_CONTEXTS[2]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, FP8)
    q = randn(gen, len(context_lens), num_q_heads, head_dim, dtype=q_dtype, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5, kv.k_scale, kv.v_scale)
    assert_close(paged_decode_attention(*args, num_splits=num_splits), paged_decode_attention_ref(*args),
                 torch.bfloat16)


def test_decode_fp8_cache_keeps_its_precision_for_small_and_large_values(gen, device):
    """On a GPU the FP8 cache's dots run in fp16, where p * v_scale of a small V would fall below fp16's normal
    range (the kernel lifts it): V a hundred times smaller or larger, the same e4m3 values, is as exact."""
    context_lens = [700, 1500]
    kv = make_paged_kv(gen, device, context_lens, 2, 64, FP8)
    q = randn(gen, len(context_lens), 8, 64, dtype=torch.bfloat16, device=device)
    v_scale = kv.v_scale.clone()

    def error(v_magnitude: float) -> float:
        kv.v_scale.copy_(v_scale * v_magnitude)
        args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 64**-0.5, kv.k_scale, kv.v_scale)
        out, ref = paged_decode_attention(*args).float(), paged_decode_attention_ref(*args).float()
        return ((out - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()

    base = error(1.0)
    for v_magnitude in (1e-2, 1e2):
        assert error(v_magnitude) <= 1.5 * base, (v_magnitude, error(v_magnitude), base)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8])
def test_rotary_write_then_decode_chain(gen, device, cache_dtype):
    """A decode step's chain launched back to back, as a layer runs it: a kernel producing q, k, v, the
    rotary + KV write of the new tokens, then decode attention over contexts that end with them: it
    sees the new tokens' rotated q and their KV at the last position of each context."""
    num_q_heads, num_kv_heads, head_dim = 8, 2, 64
    context_lens = [1, 17, 80, 200]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, cache_dtype)
    positions = kv.context_lens.long() - 1
    block_size = kv.k_cache.shape[1]
    rows = torch.arange(len(context_lens), device=device)
    slots = kv.block_tables[rows, positions // block_size].long() * block_size + positions % block_size
    table = compute_cos_sin_cache(head_dim, 256, 10000.0, None).to(device)
    dtype = torch.bfloat16
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    hidden = randn(gen, len(context_lens), width, dtype=dtype, device=device)
    gain = randn(gen, width, dtype=dtype, device=device)
    scales = (kv.k_scale, kv.v_scale)
    ref_caches = [None if t is None else t.clone() for t in (kv.k_cache, kv.v_cache, *scales)]
    qkv = hidden * gain  # the producer
    q, k, v = qkv.view(len(context_lens), -1, head_dim).split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    q_rot = rotary_and_write_kv(q, k, v, positions, table, kv.k_cache, kv.v_cache, slots, *scales)
    out = paged_decode_attention(q_rot, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens,
                                 head_dim**-0.5, *scales)
    q_ref = rotary_and_write_kv_ref(q, k, v, positions, table, *ref_caches[:2], slots, *ref_caches[2:])
    expected = paged_decode_attention_ref(q_ref, *ref_caches[:2], kv.block_tables, kv.context_lens,
                                          head_dim**-0.5, *ref_caches[2:])
    assert_close(out, expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16, *in_full_run(FP8)])  # ~1.5 s each
def test_decode_short_contexts_use_fewer_splits(gen, device, dtype):
    """The heuristic's split count is an upper bound: with splits of at least 32 tokens, these
    contexts run on 1, 2, 3 and all 4 splits of the grid within one launch, merged in that launch;
    a second launch finds the arrival counters reset."""
    context_lens = [20, 64, 65, 90, 200]
    kv = make_paged_kv(gen, device, context_lens, 2, 64, dtype)
    q_dtype = torch.bfloat16 if dtype == FP8 else dtype
    args = (kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125, kv.k_scale, kv.v_scale)
    params = dict(BLOCK_N=16, min_tokens_per_split=32, target_programs=40, max_splits=4)
    with override_launch_params("paged_decode_attention", **params):
        for _ in range(2):
            q = randn(gen, len(context_lens), 8, 64, dtype=q_dtype, device=device)
            assert_close(paged_decode_attention(q, *args), paged_decode_attention_ref(q, *args),
                         torch.bfloat16 if dtype == FP8 else dtype)


def test_decode_contract_violations(gen, device):
    kv = make_paged_kv(gen, device, [5], 2, 64, torch.float32)
    with pytest.raises(ValueError, match="num_kv_heads"):
        q = torch.ones(1, 3, 64, device=device)
        paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 1.0)
    with pytest.raises(ValueError, match="k_cache"):
        q = torch.ones(1, 4, 64, dtype=torch.bfloat16, device=device)
        paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 1.0)
    with pytest.raises(ValueError, match="context_lens"):
        q = torch.ones(1, 4, 64, device=device)
        paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens[:0], 1.0)


@pytest.mark.parametrize("scale", [0.0, -0.125, float("inf"), float("nan")])
def test_attention_refuses_a_scale_that_is_not_positive(gen, device, scale):
    # The kernels scale each row's max instead of every score: only right for a positive scale.
    kv = make_paged_kv(gen, device, [5], 2, 64, torch.float32)
    q = torch.ones(1, 4, 64, device=device)
    cu_seqlens = torch.tensor([0, 1], dtype=torch.int32, device=device)
    for attend in (paged_decode_attention, paged_decode_attention_ref):
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            attend(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, scale)
    for attend in (paged_prefill_attention, paged_prefill_attention_ref):
        with pytest.raises(ValueError, match="scale must be a positive finite number"):
            attend(q, kv.k_cache, kv.v_cache, kv.block_tables, cu_seqlens, kv.context_lens, scale)


