"""Paged causal attention for prefill: packed variable-length query chunks over cached KV.

Sequence b's queries are the last cu_seqlens_q[b+1] - cu_seqlens_q[b] positions of its
context_lens[b] tokens, so full prefill, chunked prefill and prefix-cache hits are one case.

FP8 KV: the kernel reads e4m3 tiles, widens them in registers and runs its dots in fp16 (its own
launch config entry; on the H200 1.42x bf16's time at 1 x 8192, docs/benchmarks-journal.md: the
widened tiles go back through shared memory for the tensor cores, and the tiles are smaller to fit).
A call of at least `dequantize_min_tokens` query tokens (launch config; null: never) instead copies
the blocks its sequences read into a bf16 scratch cache first (kv_store.dequantize_kv_blocks: each
block read once, written once) and runs the bf16 kernel on it, which pays when each KV tile is read
by many query tiles, as in a long prompt's chunks (workload (c)). h200.json (also the H100's) sets 1024: on
the H100 the 8k-of-16k chunk ran at 0.70x bf16's rate on e4m3 tiles and 0.99-1.00x dequantized first (two
runs, bench_kernels prefill_16k_chunk). The copy moves 3 bytes per cached element where the kernel's dots
grow with the queries too, so for 1024 queries over a 16k context it costs ~0.03 ms against the e4m3 tiles'
~0.15 ms extra (estimated from those rates); far below 1024 the copy outweighs them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._attention_ref import attend_paged_ref
from llm_engine.kernels._paged_kv import attend_kv_tile, attention_out, dot_operand
from llm_engine.kernels._validate import (
    expect_dtype,
    expect_launchable,
    expect_paged_attention_args,
    expect_power_of_two,
    expect_shape,
    output_like,
)
from llm_engine.kernels.kv_store import dequantize_kv_blocks
from llm_engine.kernels.launch_config import interpreting, launch_params

LOG2_E = 1.4426950408889634
# The smallest BLOCK_B (sequences scanned per program to find its tile): fewer variants to compile.
MIN_BATCH_BUCKET = 16


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T_total, Hq, D] packed by cu_seqlens_q [B+1] -> [T_total, Hq, D] (into `out` if given);
    causal by absolute position."""
    _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, k_scale, v_scale)
    out = output_like(out, q)
    bounds = cu_seqlens_q.tolist()
    for b, context_len in enumerate(context_lens.tolist()):
        start, end = bounds[b], bounds[b + 1]
        if end > start:
            out[start:end] = attend_paged_ref(q[start:end], k_cache, v_cache, k_scale, v_scale,
                                              block_tables[b], context_len, scale).to(q.dtype)
    return out


# Step-dependent ints are not specialised on (== 1, % 16), nor the metadata pointers on their
# alignment (a mixed step passes row slices), so no batch shape compiles a variant while serving.
@triton.jit(do_not_specialize=["stride_bt", "batch"],
            do_not_specialize_on_alignment=["block_tables_ptr", "cu_seqlens_ptr", "context_lens_ptr",
                                            "stride_bt", "batch"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, cu_seqlens_ptr, context_lens_ptr,
    out_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cache_token, stride_cache_head, stride_bt,
    batch, num_kv_heads, group,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    FP8_AS_FP16: tl.constexpr,
):
    # Last tiles first: under the causal mask they are the longest, and starting them first
    # keeps the GPU's last wave short.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    # The grid is sized without reading cu_seqlens on the host (no sync), so each program
    # finds its (sequence, query tile) from the running sum of per-sequence tile counts.
    seqs = tl.arange(0, BLOCK_B)
    seq_mask = seqs < batch
    seq_starts = tl.load(cu_seqlens_ptr + seqs, mask=seq_mask, other=0)
    seq_ends = tl.load(cu_seqlens_ptr + seqs + 1, mask=seq_mask, other=0)
    tiles_per_seq = tl.cdiv(seq_ends - seq_starts, BLOCK_M)
    tiles_end = tl.cumsum(tiles_per_seq, axis=0)
    seq = tl.sum((tiles_end <= tile).to(tl.int32), axis=0)
    if seq < batch:
        # Positions in 32 bits whatever the metadata's width (the causal mask compares one per
        # score); q_begin addresses in 64.
        first_tile = tl.sum(tl.where(seqs == seq, tiles_end - tiles_per_seq, 0), axis=0).to(tl.int32)
        q_begin = tl.load(cu_seqlens_ptr + seq)
        num_queries = (tl.load(cu_seqlens_ptr + seq + 1) - q_begin).to(tl.int32)
        q_begin = q_begin.to(tl.int64)
        context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
        rows = (tile - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = (rows < num_queries)[:, None]
        q_positions = context_len - num_queries + rows
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + (q_begin + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :],
                    mask=row_mask, other=0.0)
        q = dot_operand(q, UPCAST_DOT, FP8_AS_FP16)

        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        # Causal: nothing past this tile's last query position is needed, and KV tiles up to its
        # first query position are visible to every row: only the tiles between need the mask.
        first_position = context_len - num_queries + (tile - first_tile) * BLOCK_M
        kv_end = tl.minimum(context_len, first_position + BLOCK_M)
        unmasked_end = (first_position + 1) // BLOCK_N * BLOCK_N
        block_table_row_ptr = block_tables_ptr + seq * stride_bt
        # Every row sees KV position 0 in the first tile, so the running max is finite from then on.
        for tile_start in range(0, unmasked_end, BLOCK_N):
            m_i, l_i, acc = attend_kv_tile(
                m_i, l_i, acc, q, qk_scale, tile_start, kv_end, q_positions, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                v_scale_ptr, block_table_row_ptr, kv_head, num_kv_heads, stride_cache_token, stride_cache_head,
                PAGE_SIZE, BLOCK_N, False, False, IS_FP8, DOT_PRECISION)
        for tile_start in range(unmasked_end, kv_end, BLOCK_N):
            m_i, l_i, acc = attend_kv_tile(
                m_i, l_i, acc, q, qk_scale, tile_start, kv_end, q_positions, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                v_scale_ptr, block_table_row_ptr, kv_head, num_kv_heads, stride_cache_token, stride_cache_head,
                PAGE_SIZE, BLOCK_N, False, True, IS_FP8, DOT_PRECISION)

        out = attention_out(acc, l_i, IS_FP8)
        out_offsets = (q_begin + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T_total, Hq, D] packed by cu_seqlens_q [B+1] -> [T_total, Hq, D] (into `out` if given);
    causal by absolute position."""
    _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, k_scale, v_scale)
    expect_launchable("q", q, "paged_prefill_attention_ref")
    num_tokens, num_q_heads, head_dim = q.shape
    expect_power_of_two("head_dim", head_dim, 16)
    _, block_size, num_kv_heads, _ = k_cache.shape
    batch = block_tables.shape[0]
    out = output_like(out, q)
    if num_tokens == 0 or batch == 0:
        return out
    params = launch_params("paged_prefill_attention", q.device, q.dtype, k_cache.dtype)
    block_m = params["BLOCK_M"]
    is_fp8 = k_cache.dtype == torch.float8_e4m3fn
    threshold = params["dequantize_min_tokens"]
    if is_fp8 and threshold is not None and num_tokens >= threshold:
        k_cache, v_cache, block_tables = dequantize_kv_blocks(k_cache, v_cache, k_scale, v_scale, block_tables,
                                                              context_lens, q.dtype)
        return paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out=out)
    # Each sequence wastes at most one partial tile; programs past the real tiles exit at once.
    max_tiles = triton.cdiv(num_tokens, block_m) + batch
    _prefill_kernel[(max_tiles, num_q_heads)](
        q, k_cache, v_cache,
        k_scale if is_fp8 else k_cache, v_scale if is_fp8 else v_cache,
        block_tables, cu_seqlens_q, context_lens,
        out,
        scale * LOG2_E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        batch, num_kv_heads, num_q_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=params["BLOCK_N"],
        BLOCK_B=prefill_batch_bucket(batch),
        IS_FP8=is_fp8,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16,
        FP8_AS_FP16=is_fp8 and q.dtype == torch.bfloat16,
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
    )
    return out


def prefill_batch_bucket(batch: int) -> int:
    """The BLOCK_B variant serving a batch: powers of two from MIN_BATCH_BUCKET, so a warm-up
    can compile each of the few variants once."""
    return max(MIN_BATCH_BUCKET, triton.next_power_of_2(batch))


def _check_args(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, k_scale, v_scale) -> None:
    expect_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale)
    expect_shape("cu_seqlens_q", cu_seqlens_q, (block_tables.shape[0] + 1,))
    expect_dtype("cu_seqlens_q", cu_seqlens_q, (torch.int32, torch.int64))
