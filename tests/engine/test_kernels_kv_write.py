"""The torch references against naive dense float64 attention, FP8 quantization, and the fused rotary +
paged KV-cache write against its reference."""
from __future__ import annotations

import pytest
import torch
from paged_kv_cases import FP8, GQA, assert_close, dense_attention_f64, make_paged_kv, randn
from tiers import in_full_run

from llm_engine.kernels import (
    FP8_E4M3_MAX,
    dequantize_fp8_cache_ref,
    dequantize_fp8_ref,
    gather_kv_ref,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    quantize_fp8_ref,
    rotary_and_write_kv,
    rotary_and_write_kv_ref,
    write_kv_cache_ref,
)
from llm_engine.model.layers.rotary_embedding import compute_cos_sin_cache

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
@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_dim", [*in_full_run((1, 1, 64), (6, 3, 128)), (8, 4, 32)])
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
            (kv.v_cache, kv.v_scale, expected[1], expected[3], 0, 1.0)):   # V, unrotated: the cast's bytes
        torch.testing.assert_close(scale, ref_scale, atol=0, rtol=rtol)
        # The kernel rounds to the e4m3 grid itself, so bytes normally match torch's cast
        # exactly; an inexact division could still put a value on the neighbouring step, hence
        # the tolerance of one e4m3 step (2^-3 of the value) plus one subnormal step, rather
        # than the 2^-4 half step of a single rounding.
        ref = dequantize_fp8_cache_ref(ref_cache, ref_scale)
        error = (dequantize_fp8_cache_ref(cache, scale) - ref).abs()
        assert (error <= ref.abs() / 8 + ref_scale.transpose(1, 2)[..., None] * 2**-9).all()
        same_bytes = (cache.view(torch.uint8) == ref_cache.view(torch.uint8)).float().mean()
        assert same_bytes >= same


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


