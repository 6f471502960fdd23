"""The fused rotary + paged KV-cache write, and paged decode / prefill attention, against their torch
references.

The references themselves are checked against naive dense float64 attention first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from llm_engine.kernels import (
    FP8_E4M3_MAX,
    dequantize_fp8_cache_ref,
    dequantize_fp8_ref,
    gather_kv_ref,
    paged_decode_attention,
    paged_decode_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    quantize_fp8_cache_ref,
    quantize_fp8_ref,
    rotary_and_write_kv,
    rotary_and_write_kv_ref,
    write_kv_cache_ref,
)
from llm_engine.kernels.launch_config import override_launch_params
from llm_engine.model.layers.rotary_embedding import compute_cos_sin_cache

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


# --- the references against naive dense attention -------------------------------------------

@pytest.mark.parametrize("cache_dtype", [torch.float32, FP8])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", GQA)
def test_refs_match_dense_float64_attention(gen, cache_dtype, num_q_heads, num_kv_heads):
    context_lens, query_lens = [1, 17, 40], [1, 5, 40]
    kv = make_paged_kv(gen, "cpu", context_lens, num_kv_heads, 32, cache_dtype)
    scale = 32**-0.5
    q = torch.randn(sum(query_lens), num_q_heads, 32, generator=gen)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    prefill = paged_prefill_attention_ref(q, kv.k_cache, kv.v_cache, kv.block_tables, cu,
                                          kv.context_lens, scale, kv.k_scale, kv.v_scale)
    decode_q = torch.randn(len(context_lens), num_q_heads, 32, generator=gen)
    decode = paged_decode_attention_ref(decode_q, kv.k_cache, kv.v_cache, kv.block_tables,
                                        kv.context_lens, scale, kv.k_scale, kv.v_scale)
    for b, (n_ctx, n_q) in enumerate(zip(context_lens, query_lens)):
        # The sequence's KV, read by block arithmetic independently of gather_kv_ref.
        slots = [int(kv.block_tables[b, t // 16]) * 16 + t % 16 for t in range(n_ctx)]
        flat = lambda c: c.reshape(-1, *c.shape[2:])[slots].float()  # noqa: E731
        k, v = flat(kv.k_cache), flat(kv.v_cache)
        if cache_dtype == FP8:
            k = k * kv.k_scale.transpose(1, 2).reshape(-1, num_kv_heads)[slots][..., None]
            v = v * kv.v_scale.transpose(1, 2).reshape(-1, num_kv_heads)[slots][..., None]
        positions = list(range(n_ctx - n_q, n_ctx))
        expected = dense_attention_f64(q[cu[b] : cu[b + 1]], k, v, scale, positions)
        torch.testing.assert_close(prefill[cu[b] : cu[b + 1]].double(), expected, atol=1e-5, rtol=1e-5)
        expected = dense_attention_f64(decode_q[b : b + 1], k, v, scale, [n_ctx - 1])
        torch.testing.assert_close(decode[b : b + 1].double(), expected, atol=1e-5, rtol=1e-5)


def test_fp8_quantize_ref_round_trip(gen):
    x = torch.randn(64, 4, 128, generator=gen) * torch.rand(64, 4, 1, generator=gen) * 10
    values, scale = quantize_fp8_ref(x)
    torch.testing.assert_close(scale, x.abs().amax(-1) / FP8_E4M3_MAX)
    # Round to nearest with a 3-bit mantissa: within half a step, 2^-4 relative, plus the
    # subnormal step (2^-9 of the scale) near zero.
    error = (dequantize_fp8_ref(values, scale) - x).abs()
    assert (error <= x.abs() / 16 + scale[..., None] * 2**-9).all()


def test_write_then_gather_ref_round_trip(gen):
    kv = make_paged_kv(gen, "cpu", [20, 9], 2, 32, torch.float32, block_size=8)
    k, v = torch.randn(2, 9, 2, 32, generator=gen).unbind(0)
    slot_of = lambda t: int(kv.block_tables[1, t // 8]) * 8 + t % 8  # noqa: E731
    write_kv_cache_ref(k, v, kv.k_cache, kv.v_cache, torch.tensor([slot_of(t) for t in range(9)]))
    assert torch.equal(gather_kv_ref(kv.k_cache, None, kv.block_tables[1], 9), k)
    assert torch.equal(gather_kv_ref(kv.v_cache, None, kv.block_tables[1], 9), v)


# --- rotary + write_kv_cache --------------------------------------------------------------------

@pytest.mark.parametrize("cache_dtype, dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (FP8, torch.bfloat16), (FP8, torch.float32),
])
@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_dim", [(1, 1, 64), (6, 3, 128), (8, 4, 32)])
def test_rotary_and_write_kv_matches_ref(gen, device, cache_dtype, dtype, num_q_heads, num_kv_heads, head_dim):
    kv = make_paged_kv(gen, device, [40, 24], num_kv_heads, head_dim, cache_dtype)
    num_slots = kv.k_cache.shape[0] * kv.k_cache.shape[1]
    num_tokens = 37
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[[3, 20]] = -1  # padding tokens: nothing is written for them
    slots = slots.to(device)
    positions = torch.randint(0, 500, (num_tokens,), generator=gen).to(device)
    table = compute_cos_sin_cache(head_dim, 500, 10000.0, None).to(device)
    magnitude = torch.rand(num_tokens, num_kv_heads, 1, generator=gen).to(device) * 4
    q = randn(gen, num_tokens, num_q_heads, head_dim, dtype=dtype, device=device)
    # Views with a row stride, as the model passes slices of its fused qkv projection.
    kv_new = randn(gen, num_tokens, 2 * num_kv_heads, head_dim, dtype=dtype, device=device)
    k, v = kv_new[:, :num_kv_heads] * magnitude.to(dtype), kv_new[:, num_kv_heads:]
    inputs = [t.clone() for t in (q, k, v)]
    clone = lambda t: None if t is None else t.clone()  # noqa: E731
    expected = [clone(t) for t in (kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale)]
    q_out = rotary_and_write_kv(q, k, v, positions, table, kv.k_cache, kv.v_cache, slots, kv.k_scale, kv.v_scale)
    q_ref = rotary_and_write_kv_ref(q, k, v, positions, table, *expected[:2], slots, *expected[2:])
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), inputs))
    assert q_out.dtype == dtype
    assert_close(q_out, q_ref, dtype)
    if cache_dtype != FP8:
        # The rotation may round differently by a step where the GPU fuses a multiply-add; V is copied.
        assert_close(kv.k_cache, expected[0], cache_dtype)
        assert torch.equal(kv.v_cache, expected[1])
        return
    # The rotated K is rounded to bf16 before it is quantized; the interpreter truncates there
    # where torch rounds, so K's scales may be a bf16 step (2^-7) apart and a few more bytes differ.
    k_rtol, k_same = (1e-5, 0.999) if dtype == torch.float32 else (2**-7, 0.95)
    for cache, scale, ref_cache, ref_scale, rtol, same in (
            (kv.k_cache, kv.k_scale, expected[0], expected[2], k_rtol, k_same),
            (kv.v_cache, kv.v_scale, expected[1], expected[3], 1e-6, 0.999)):
        torch.testing.assert_close(scale, ref_scale, atol=0, rtol=rtol)
        # The kernel rounds to the e4m3 grid itself, so bytes normally match torch's cast
        # exactly; an inexact division could still put a value on the neighbouring step, hence
        # the tolerance of one e4m3 step (2^-3 of the value) plus one subnormal step, rather
        # than the 2^-4 half step of a single rounding.
        ref = dequantize_fp8_cache_ref(ref_cache, ref_scale)
        error = (dequantize_fp8_cache_ref(cache, scale) - ref).abs()
        assert (error <= ref.abs() / 8 + ref_scale.transpose(1, 2)[..., None] * 2**-9).all()
        same_bytes = (cache.view(torch.uint8) == ref_cache.view(torch.uint8)).float().mean()
        assert same_bytes > same


def test_rotary_and_write_kv_contract_violations(device):
    q, k = torch.ones(2, 4, 32, device=device), torch.ones(2, 1, 32, device=device)
    positions = torch.zeros(2, dtype=torch.int64, device=device)
    slots = torch.zeros(2, dtype=torch.int64, device=device)
    table = torch.ones(4, 32, device=device)
    cache = torch.zeros(2, 16, 1, 32, device=device)
    with pytest.raises(ValueError, match="k_scale"):
        fp8 = cache.to(FP8)
        rotary_and_write_kv(q, k, k, positions, table, fp8, fp8.clone(), slots)
    with pytest.raises(ValueError, match="rotary_dim"):
        rotary_and_write_kv(q, k, k, positions, table[:, :16], cache, cache.clone(), slots)
    with pytest.raises(ValueError, match="positions"):
        rotary_and_write_kv(q, k, k, positions[:1], table, cache, cache.clone(), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_and_write_kv(q, k, k, positions, table, cache, cache.clone(), slots[:1])


# --- paged decode attention -------------------------------------------------------------------

DECODE_CONTEXTS = [[1, 15, 16, 17], [47, 80], [33]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, 128])
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
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_fp8_cache_matches_ref(gen, device, num_q_heads, num_kv_heads, head_dim, num_splits):
    context_lens = DECODE_CONTEXTS[0] if num_splits == 1 else DECODE_CONTEXTS[2]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, FP8)
    q = randn(gen, len(context_lens), num_q_heads, head_dim, dtype=torch.bfloat16, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5, kv.k_scale, kv.v_scale)
    assert_close(paged_decode_attention(*args, num_splits=num_splits), paged_decode_attention_ref(*args),
                 torch.bfloat16)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8])
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


# --- paged prefill attention ------------------------------------------------------------------

# (context_lens, query_lens): full prefill over several query tiles, a chunk at the end of a
# longer context, and a mixed batch of prefix-cache hits, a one-token chunk and an idle sequence.
PREFILL_CASES = [
    ([45, 20], [45, 20]),
    ([70], [16]),
    ([1, 16, 33, 30], [1, 3, 33, 0]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("context_lens, query_lens", PREFILL_CASES)
def test_prefill_matches_ref(gen, device, dtype, num_q_heads, num_kv_heads, head_dim, context_lens, query_lens):
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, dtype)
    q = randn(gen, sum(query_lens), num_q_heads, head_dim, dtype=dtype, device=device)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, head_dim**-0.5)
    out = paged_prefill_attention(*args)
    assert out.dtype == dtype
    assert_close(out, paged_prefill_attention_ref(*args), dtype)


@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_fp8_cache_matches_ref(gen, device, num_q_heads, num_kv_heads, head_dim):
    context_lens, query_lens = PREFILL_CASES[2]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, FP8)
    q = randn(gen, sum(query_lens), num_q_heads, head_dim, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, head_dim**-0.5, kv.k_scale, kv.v_scale)
    assert_close(paged_prefill_attention(*args), paged_prefill_attention_ref(*args), torch.bfloat16)


def test_prefill_other_block_size(gen, device):
    kv = make_paged_kv(gen, device, [7, 8, 9, 30], 2, 32, torch.float32, block_size=8)
    query_lens = [7, 2, 9, 12]
    q = randn(gen, sum(query_lens), 4, 32, dtype=torch.float32, device=device)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 32**-0.5)
    assert_close(paged_prefill_attention(*args), paged_prefill_attention_ref(*args), torch.float32)


# --- outputs into a caller's buffer (a CUDA graph's static rows, one step's decodes then prefills) --

@pytest.mark.parametrize("use_ref", [False, True])
def test_ops_write_into_rows_of_a_given_buffer(gen, device, use_ref):
    """Decode rows then prefill rows of one [T, Hq * D] buffer, and the rotated q into a buffer:
    the same values as the ops' own outputs, nothing written outside the rows given."""
    decode = paged_decode_attention_ref if use_ref else paged_decode_attention
    prefill = paged_prefill_attention_ref if use_ref else paged_prefill_attention
    rotary = rotary_and_write_kv_ref if use_ref else rotary_and_write_kv
    heads, kv_heads, dim = 4, 2, 32
    context_lens, query_lens = [20, 33, 9], [1, 5, 9]  # one decode, then two prefill chunks
    kv = make_paged_kv(gen, device, context_lens, kv_heads, dim, torch.float32)
    q = randn(gen, sum(query_lens), heads, dim, dtype=torch.float32, device=device)
    buffer = torch.full((sum(query_lens) + 2, heads * dim), 7.0, device=device)
    rows = buffer[1:-1].view(-1, heads, dim)
    d = 1
    cu = torch.tensor([0, 5, 14], dtype=torch.int32, device=device)
    decode_args = (q[:d], kv.k_cache, kv.v_cache, kv.block_tables[:d], kv.context_lens[:d], dim**-0.5)
    prefill_args = (q[d:], kv.k_cache, kv.v_cache, kv.block_tables[d:], cu, kv.context_lens[d:], dim**-0.5)
    assert decode(*decode_args, out=rows[:d]).data_ptr() == rows.data_ptr()
    prefill(*prefill_args, out=rows[d:])
    assert_close(rows[:d], decode(*decode_args), torch.float32)
    assert_close(rows[d:], prefill(*prefill_args), torch.float32)
    assert (buffer[0] == 7).all() and (buffer[-1] == 7).all()

    positions = torch.arange(q.shape[0], device=device)
    table = compute_cos_sin_cache(dim, 64, 10000.0, None).to(device)
    k = randn(gen, q.shape[0], kv_heads, dim, dtype=torch.float32, device=device)
    slots = torch.full((q.shape[0],), -1, device=device)  # nothing written: only q_out is compared
    q_buffer = torch.zeros(q.shape[0] + 1, heads, dim, device=device)
    got = rotary(q, k, k, positions, table, kv.k_cache, kv.v_cache, slots, q_out=q_buffer[1:])
    assert got.data_ptr() == q_buffer[1].data_ptr() and not q_buffer[0].any()
    assert_close(got, rotary(q, k, k, positions, table, kv.k_cache, kv.v_cache, slots), torch.float32)
    with pytest.raises(ValueError, match="out"):
        decode(*decode_args, out=rows[:2])
