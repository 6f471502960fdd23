"""Paged prefill attention against its torch reference, and both attention kernels writing into rows of a
caller's buffer."""
from __future__ import annotations

import pytest
import torch
from paged_kv_cases import FP8, GQA, assert_close, make_paged_kv, randn
from tiers import FLOAT32_IN_FULL_RUN, in_full_run

from llm_engine.kernels import (
    gather_kv_ref,
    paged_decode_attention,
    paged_decode_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    rotary_and_write_kv,
    rotary_and_write_kv_ref,
)
from llm_engine.kernels.kv_store import dequantize_kv_blocks, dequantize_kv_blocks_ref
from llm_engine.kernels.launch_config import override_launch_params
from llm_engine.model.layers.rotary_embedding import compute_cos_sin_cache

# --- paged prefill attention ------------------------------------------------------------------

# (context_lens, query_lens): full prefill over several query tiles, a chunk at the end of a
# longer context, and a mixed batch of prefix-cache hits, a one-token chunk and an idle sequence.
PREFILL_CASES = [
    ([45, 20], [45, 20]),
    ([70], [16]),
    ([1, 16, 33, 30], [1, 3, 33, 0]),
]


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("num_q_heads, num_kv_heads", GQA)
@pytest.mark.parametrize("head_dim", [64, *in_full_run(128)])
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
@pytest.mark.parametrize("head_dim", [64, *in_full_run(128)])
def test_prefill_fp8_cache_matches_ref(gen, device, num_q_heads, num_kv_heads, head_dim):
    context_lens, query_lens = PREFILL_CASES[2]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, head_dim, FP8)
    q = randn(gen, sum(query_lens), num_q_heads, head_dim, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, head_dim**-0.5, kv.k_scale, kv.v_scale)
    assert_close(paged_prefill_attention(*args), paged_prefill_attention_ref(*args), torch.bfloat16)


@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(4, 4), (8, 2)])
def test_prefill_fp8_cache_dequantized_first_matches_ref(gen, device, num_q_heads, num_kv_heads):
    """Past the launch config's dequantize_min_tokens, FP8 blocks go to a bf16 scratch cache and the bf16
    kernel runs on it: the same function within bf16's tolerance."""
    context_lens, query_lens = PREFILL_CASES[2]
    kv = make_paged_kv(gen, device, context_lens, num_kv_heads, 64, FP8)
    q = randn(gen, sum(query_lens), num_q_heads, 64, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 64**-0.5, kv.k_scale, kv.v_scale)
    with override_launch_params("paged_prefill_attention", dequantize_min_tokens=sum(query_lens)):
        out = paged_prefill_attention(*args)
    assert_close(out, paged_prefill_attention_ref(*args), torch.bfloat16)


def test_dequantize_kv_blocks_matches_ref(gen, device):
    """The scratch cache holds each sequence's context blocks in order (what its new table numbers), each
    value its e4m3 value times its (token, head) scale, rounded once to bf16."""
    context_lens = [1, 16, 33, 0]
    kv = make_paged_kv(gen, device, context_lens, 2, 32, FP8)
    args = (kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale, kv.block_tables, kv.context_lens, torch.bfloat16)
    k, v, tables = dequantize_kv_blocks(*args)
    k_ref, v_ref, tables_ref = dequantize_kv_blocks_ref(*args)
    assert torch.equal(tables, tables_ref) and k.shape == k_ref.shape == (4 * kv.block_tables.shape[1], 16, 2, 32)
    for b, n in enumerate(context_lens):
        for got, ref, cache, scale in ((k, k_ref, kv.k_cache, kv.k_scale), (v, v_ref, kv.v_cache, kv.v_scale)):
            if n == 0:
                continue
            expected = gather_kv_ref(cache, scale, kv.block_tables[b], n)
            actual = gather_kv_ref(got, None, tables[b], n)
            torch.testing.assert_close(gather_kv_ref(ref, None, tables_ref[b], n), expected, atol=0, rtol=2**-8)
            # One bf16 step: the interpreter truncates where torch rounds.
            torch.testing.assert_close(actual, expected, atol=0, rtol=2**-7)


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
