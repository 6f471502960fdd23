"""What the decode and prefill attention kernels share: the query's dot dtype, and one KV tile folded
into a running softmax (its load through the block table included)."""
from __future__ import annotations

import triton
import triton.language as tl

V_LIFT = tl.constexpr(256.0)   # FP8 KV: the factor p * v_scale is lifted by before its fp16 dot (attend_kv_tile)


@triton.jit
def dot_operand(q, UPCAST_DOT: tl.constexpr, FP8_AS_FP16: tl.constexpr):
    """The query in the dtype its dots run in."""
    # The interpreter's tl.dot multiplies bf16's raw uint16 storage; float32 dots sidestep it.
    if UPCAST_DOT:
        q = q.to(tl.float32)
    elif FP8_AS_FP16:
        # e4m3 -> fp16 is one instruction, -> bf16 goes through fp32: FP8 KV computes in fp16.
        q = q.to(tl.float16)
    return q


@triton.jit
def attend_kv_tile(m_i, l_i, acc, q, qk_scale, tile_start, kv_end, q_positions, k_cache_ptr, v_cache_ptr,
                   k_scale_ptr, v_scale_ptr, block_table_row_ptr, kv_head, num_kv_heads, stride_cache_token,
                   stride_cache_head, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASK_TOKENS: tl.constexpr,
                   CAUSAL: tl.constexpr, IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold the KV positions tile_start .. tile_start + BLOCK_N - 1 of one sequence's kv head into the
    running (max, sum, accumulator) of q's rows, in log2 units.

    MASK_TOKENS: positions from kv_end on are hidden (off: the caller knows the tile ends below
    kv_end, or CAUSAL hides them). CAUSAL: row r sees no position past q_positions[r], which is
    below kv_end for every row that is stored (a padding row past the queries sees copies of
    position kv_end - 1, and is never stored). A position from kv_end on loads position
    kv_end - 1 instead: every load stays in bounds without a mask (a masked load costs a
    predicate per access), and only the scores are masked. FP8 scales ([block, kv head, offset]:
    one head's scales of a block are contiguous) are applied to the scores and the
    probabilities, outside the dots.
    """
    tokens = tile_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, q.shape[1])
    loaded = tl.minimum(tokens, kv_end - 1) if MASK_TOKENS or CAUSAL else tokens
    block_ids = tl.load(block_table_row_ptr + loaded // PAGE_SIZE).to(tl.int64)
    offsets = loaded % PAGE_SIZE
    slots = block_ids * PAGE_SIZE + offsets
    rows = slots[:, None] * stride_cache_token + kv_head * stride_cache_head
    # e4m3 values are exact in q's dtype.
    k = tl.load(k_cache_ptr + rows + dims[None, :]).to(q.dtype)
    v = tl.load(v_cache_ptr + rows + dims[None, :]).to(q.dtype)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if IS_FP8:
        scale_offsets = (block_ids * num_kv_heads + kv_head) * PAGE_SIZE + offsets
        k_scale = tl.load(k_scale_ptr + scale_offsets)
        scores = scores * (k_scale * qk_scale)[None, :]
    if MASK_TOKENS:
        scores = tl.where(tokens[None, :] < kv_end, scores, float("-inf"))
    if CAUSAL:
        scores = tl.where(tokens[None, :] <= q_positions[:, None], scores, float("-inf"))
    if IS_FP8:
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp2(scores - m_new[:, None])
    else:
        # qk_scale > 0 (the wrappers check), so the row max is taken before the multiply, which
        # then fuses with the subtraction of the max into one FFMA (Triton's default fp fusion).
        m_new = tl.maximum(m_i, tl.max(scores, axis=1) * qk_scale)
        p = tl.exp2(scores * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IS_FP8:
        # p * v_scale in fp16 (FP8_AS_FP16) falls below fp16's normal range for small V (v_scale = amax / 448):
        # lifted by V_LIFT (a power of two: exact), the product keeps fp16's precision (a V head of amax 0.01:
        # 2.5e-4 relative error against 1.7e-2 unlifted, emulated); fp16 overflows only past amax 114,000.
        # acc stays lifted (the dot accumulates into it); attention_out takes the lift out.
        v_scale = tl.load(v_scale_ptr + scale_offsets)
        p = p * (v_scale * V_LIFT)[None, :]
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def attention_out(acc, l_i, IS_FP8: tl.constexpr):
    """The attention output of the running sum and accumulator (attend_kv_tile's, FP8's lifted)."""
    if IS_FP8:
        l_i = l_i * V_LIFT
    return acc / l_i[:, None]
