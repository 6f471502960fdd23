"""Paged attention for decode: one query token per sequence, split-KV (flash-decoding).

Each (sequence, kv head, split) program takes a slice of the context and all query heads sharing
that kv head (GQA), so each KV tile is read once. The splits' partial results are merged by their
log-sum-exp in the same launch: each split stores its partial and counts itself in on a per
(sequence, kv head) counter, and the split that arrives last merges them all and resets the counter.
A second merge kernel would cost a launch per layer, a sizeable share of a small-batch decode step.
A context shorter than the split count needs runs on fewer splits (at least `min_tokens_per_split`
each); one split writes the output directly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._paged_kv import attend_kv_tile, attention_out, dot_operand
from llm_engine.kernels._validate import (
    expect_launchable,
    expect_paged_attention_args,
    expect_power_of_two,
    expect_shape,
    output_like,
)
from llm_engine.kernels.kv_store import gather_kv_batch_ref
from llm_engine.kernels.launch_config import interpreting, launch_params

LOG2_E = 1.4426950408889634
# tl.dot needs at least 16 rows, so a GQA group is padded up to this many query heads.
MIN_DOT_ROWS = 16
# Splits the merging program reads per loop iteration.
MERGE_BLOCK_S = 8
# Arrival counters, one per (sequence, kv head), per device: zero between launches (the merging
# split resets its own). Launches on one device run in stream order (the engine uses one stream).
_split_counters: dict[torch.device, torch.Tensor] = {}


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D], the token at position context_lens[b] - 1 (its KV already cached) -> [B, Hq, D]
    (into `out` if given).

    num_splits only shapes the kernel's work split; the reference ignores it.
    """
    _check_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale)
    out = output_like(out, q)
    if q.shape[0] == 0:
        return out
    # The whole batch at once (the CPU serves decodes with this): padded to the longest context.
    length = int(context_lens.max())
    k = gather_kv_batch_ref(k_cache, k_scale, block_tables, length)
    v = gather_kv_batch_ref(v_cache, v_scale, block_tables, length)
    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bkhd->bhk", q.float(), k) * scale
    past_context = torch.arange(length, device=q.device)[None, :] >= context_lens[:, None].long()
    scores.masked_fill_(past_context[:, None, :], float("-inf"))
    out.copy_(torch.einsum("bhk,bkhd->bhd", scores.softmax(dim=-1), v))
    return out


# Step-dependent ints are not specialised on (== 1, % 16), nor the metadata pointers on their
# alignment (a mixed step passes row slices), so no batch shape compiles a variant while serving.
@triton.jit(do_not_specialize=["stride_bt", "num_splits", "min_split_len"],
            do_not_specialize_on_alignment=["block_tables_ptr", "context_lens_ptr", "stride_bt", "num_splits",
                                            "min_split_len"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, partial_out_ptr, partial_lse_ptr, counters_ptr,
    qk_scale,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_cache_token, stride_cache_head, stride_bt,
    num_q_heads, num_kv_heads, num_splits, min_split_len,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    FP8_AS_FP16: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    # Whole BLOCK_N tiles per split, so only the context's last tile is partial; no split shorter
    # than min_split_len (a multiple of BLOCK_N), so a short context uses only its first splits.
    split_len = tl.maximum(tl.cdiv(tl.cdiv(context_len, num_splits), BLOCK_N) * BLOCK_N, min_split_len)
    num_active = tl.cdiv(context_len, split_len)
    if split < num_active:
        split_start = split * split_len
        split_end = tl.minimum(split_start + split_len, context_len)

        group_rows = tl.arange(0, BLOCK_G)
        heads = kv_head * GROUP + group_rows
        head_mask = (group_rows < GROUP)[:, None]
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=head_mask,
                    other=0.0)
        q = dot_operand(q, UPCAST_DOT, FP8_AS_FP16)

        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
        block_table_row_ptr = block_tables_ptr + seq * stride_bt
        for tile_start in range(split_start, split_end, BLOCK_N):
            m_i, l_i, acc = attend_kv_tile(
                m_i, l_i, acc, q, qk_scale, tile_start, split_end, None, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                v_scale_ptr, block_table_row_ptr, kv_head, num_kv_heads, stride_cache_token, stride_cache_head,
                PAGE_SIZE, BLOCK_N, True, False, IS_FP8, DOT_PRECISION)

        acc = attention_out(acc, l_i, IS_FP8)
        if num_active == 1:
            out_offsets = seq * stride_ob + heads[:, None] * stride_oh + dims[None, :]
            tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=head_mask)
        else:
            rows = (seq * num_q_heads + heads) * num_splits + split
            tl.store(partial_lse_ptr + rows, m_i + tl.log2(l_i), mask=group_rows < GROUP)
            tl.store(partial_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :], acc, mask=head_mask)
            # Every warp's partial is written before the (release) arrival; the last to arrive
            # (acquire) reads the others' partials from L2, past its own L1.
            tl.debug_barrier()
            counter = counters_ptr + seq * num_kv_heads + kv_head
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_active - 1:
                tl.store(counter, 0)
                for g in tl.static_range(GROUP):
                    head = kv_head * GROUP + g
                    merged = _merge_splits(partial_out_ptr, partial_lse_ptr, (seq * num_q_heads + head) * num_splits,
                                           num_active, HEAD_DIM, BLOCK_S)
                    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims,
                             merged.to(out_ptr.dtype.element_ty))


@triton.jit
def _merge_splits(partial_out_ptr, partial_lse_ptr, first, num_active, HEAD_DIM: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    """One query head's output from its splits' partials (rows first.. first + num_active - 1):
    a running max and sums over chunks of BLOCK_S splits, so one variant serves every split count
    (every active split saw tokens: the max is finite after the first chunk)."""
    dims = tl.arange(0, HEAD_DIM)
    m_i = tl.full([], float("-inf"), dtype=tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for chunk in range(0, num_active, BLOCK_S):
        splits = chunk + tl.arange(0, BLOCK_S)
        split_mask = splits < num_active
        lse = tl.load(partial_lse_ptr + first + splits, mask=split_mask, other=float("-inf"), cache_modifier=".cg")
        m_new = tl.maximum(m_i, tl.max(lse, axis=0))
        alpha = tl.exp2(m_i - m_new)
        weights = tl.exp2(lse - m_new)
        partial = tl.load(partial_out_ptr + (first + splits)[:, None] * HEAD_DIM + dims[None, :],
                          mask=split_mask[:, None], other=0.0, cache_modifier=".cg")
        acc = acc * alpha + tl.sum(weights[:, None] * partial, axis=0)
        total = total * alpha + tl.sum(weights, axis=0)
        m_i = m_new
    return acc / total


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, Hq, D], the token at position context_lens[b] - 1 (its KV already cached) -> [B, Hq, D]
    (into `out` if given).

    num_splits: how many programs share one sequence's context; None picks it from the launch
    config and the block table width (an upper bound on the context, known without a sync), and
    then a context too short for that many splits of min_tokens_per_split uses fewer.
    """
    _check_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale)
    expect_launchable("q", q, "paged_decode_attention_ref")
    batch, num_q_heads, head_dim = q.shape
    expect_power_of_two("head_dim", head_dim, 16)
    _, block_size, num_kv_heads, _ = k_cache.shape
    params = launch_params("paged_decode_attention", q.device, q.dtype, k_cache.dtype)
    explicit_splits = num_splits is not None
    if num_splits is None:
        num_splits = _choose_num_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, params)
    elif num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    out = output_like(out, q)
    if batch == 0:
        return out

    group = num_q_heads // num_kv_heads
    is_fp8 = k_cache.dtype == torch.float8_e4m3fn
    block_n = params["BLOCK_N"]
    # An explicit split count is used whole (tests and sweeps rely on it); the heuristic's is an
    # upper bound that short contexts do not fill.
    min_split_len = block_n if explicit_splits else triton.cdiv(params["min_tokens_per_split"], block_n) * block_n
    # Allocated even for one split (no kernel runs for them), so one compiled variant serves all.
    partial_out = torch.empty((batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    partial_lse = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=q.device)
    counters = _counters(q.device, batch * num_kv_heads)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache,
        k_scale if is_fp8 else k_cache, v_scale if is_fp8 else v_cache,
        block_tables, context_lens,
        out, partial_out, partial_lse, counters,
        scale * LOG2_E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        num_q_heads, num_kv_heads, num_splits, min_split_len,
        GROUP=group,
        BLOCK_G=max(MIN_DOT_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        PAGE_SIZE=block_size,
        BLOCK_N=block_n,
        BLOCK_S=MERGE_BLOCK_S,
        IS_FP8=is_fp8,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and q.dtype == torch.bfloat16,
        FP8_AS_FP16=is_fp8 and q.dtype == torch.bfloat16,
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
        # A register cap (data: launch_configs) that buys a resident block per SM; whether it spills
        # depends on the Triton version (benchmarks/kernel_report.py tells, on the CPU).
        maxnreg=params["maxnreg"],
    )
    return out


def _counters(device: torch.device, needed: int) -> torch.Tensor:
    """The device's zeroed arrival counters, at least `needed` of them. They are allocated on the
    first launch, which the model runner's warm-up makes before capturing any CUDA graph (a buffer
    allocated inside a capture would belong to the graph's memory pool)."""
    counters = _split_counters.get(device)
    if counters is None or counters.numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"decode split counters for {needed} (sequence, kv head) pairs must exist before "
                               "CUDA-graph capture: launch the kernel at that batch size once first")
        counters = torch.zeros(max(needed, 4096), dtype=torch.int32, device=device)
        _split_counters[device] = counters
    return counters


def _choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int, params: dict) -> int:
    """Enough programs to fill the GPU, but no split shorter than min_tokens_per_split."""
    wanted_for_occupancy = triton.cdiv(params["target_programs"], batch * num_kv_heads)
    allowed_by_length = triton.cdiv(max_context_len, params["min_tokens_per_split"])
    return max(1, min(wanted_for_occupancy, allowed_by_length, params["max_splits"]))


def _check_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale) -> None:
    expect_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale)
    expect_shape("context_lens", context_lens, (q.shape[0],))
