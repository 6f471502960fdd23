"""What the decode and prefill attention kernels share: the query's dot dtype, where a KV tile lives,
its load, the online-softmax step."""
from __future__ import annotations

import triton
import triton.language as tl


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
def tile_slots(block_table_row_ptr, tile_start, end, kv_head, num_kv_heads, PAGE_SIZE: tl.constexpr,
               BLOCK_N: tl.constexpr, V_RUN: tl.constexpr, V_TOKEN_MINOR: tl.constexpr):
    """Where the BLOCK_N positions from tile_start (a multiple of BLOCK_N) of one sequence live:
    (positions, mask of those before `end`, mask of their V runs, block ids, offsets in the block,
    (block, kv head) rows of the [block, kv head, ...] layouts).

    A token-minor V (V_TOKEN_MINOR: an FP8 cache's) is read in runs of V_RUN = min(PAGE_SIZE, BLOCK_N)
    aligned positions of one page, whole or not at all, so its loads vectorize along the tokens; a
    run's tail past `end` lies in the same page, whose id the run mask reads from the block table."""
    tokens = tl.multiple_of(tile_start, BLOCK_N) + tl.arange(0, BLOCK_N)
    token_mask = tokens < end
    if V_TOKEN_MINOR:
        run_mask = tl.max_constancy(tokens // V_RUN * V_RUN < end, V_RUN)
    else:
        run_mask = token_mask
    block_ids = tl.load(block_table_row_ptr + tokens // PAGE_SIZE, mask=run_mask, other=0).to(tl.int64)
    offsets = tokens % PAGE_SIZE
    return tokens, token_mask, run_mask, block_ids, offsets, block_ids * num_kv_heads + kv_head


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_row_ptr, tile_start, end, kv_head, num_kv_heads,
                 stride_cache_token, stride_cache_head, q, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, V_RUN: tl.constexpr, V_TOKEN_MINOR: tl.constexpr):
    """K and V [BLOCK_N, HEAD_DIM] of the positions from tile_start for one kv head, in q's dtype (K
    zero past `end`), the offsets of their FP8 scales ([block, kv head, offset] layout: one head's
    scales of a block are contiguous, so a tile reads them in whole sectors) and the position mask.
    V_TOKEN_MINOR: V is [block, kv head, dim, offset] (an FP8 cache's), else K's layout."""
    tokens, token_mask, run_mask, block_ids, offsets, head_blocks = tile_slots(
        block_table_row_ptr, tile_start, end, kv_head, num_kv_heads, PAGE_SIZE, BLOCK_N, V_RUN, V_TOKEN_MINOR)
    dims = tl.arange(0, HEAD_DIM)
    k_offsets = ((block_ids * PAGE_SIZE + offsets)[:, None] * stride_cache_token + kv_head * stride_cache_head
                 + dims[None, :])
    # e4m3 values are exact in q's dtype; FP8 scales are applied after the dots.
    k = tl.load(k_cache_ptr + k_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    if V_TOKEN_MINOR:
        v_offsets = head_blocks[:, None] * (HEAD_DIM * PAGE_SIZE) + dims[None, :] * PAGE_SIZE + offsets[:, None]
        v_offsets = tl.max_contiguous(tl.multiple_of(v_offsets, [V_RUN, 1]), [V_RUN, 1])
        # Past `end`: finite stale values (kv_cache.py), which get probability 0.
        v = tl.load(v_cache_ptr + v_offsets, mask=run_mask[:, None], other=0.0).to(q.dtype)
    else:
        v = tl.load(v_cache_ptr + k_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    return k, v, head_blocks * PAGE_SIZE + offsets, token_mask


@triton.jit
def online_softmax_step(m_i, l_i, acc, scores, v, v_scale_ptr, scale_offsets, token_mask, q,
                        IS_FP8: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one tile's masked, scaled log2-domain scores and its V into the running
    (max, sum, accumulator); FP8 V scales are applied to the probabilities."""
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IS_FP8:
        v_scale = tl.load(v_scale_ptr + scale_offsets, mask=token_mask, other=0.0)
        p = p * v_scale[None, :]
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
