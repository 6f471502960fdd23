"""What the decode and prefill attention kernels share: the query's dot dtype, the KV tile load, the
online-softmax step."""
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
def load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_row_ptr, tokens, token_mask, kv_head, num_kv_heads, dims,
                 stride_cache_token, stride_cache_head, q, PAGE_SIZE: tl.constexpr):
    """K and V of `tokens` (positions in one sequence) for one kv head, through its block table,
    in q's dtype; also the offsets of their FP8 scales ([block, kv head, offset] layout: one
    head's scales of a block are contiguous, so a tile reads them in whole sectors)."""
    block_ids = tl.load(block_table_row_ptr + tokens // PAGE_SIZE, mask=token_mask, other=0).to(tl.int64)
    offsets = tokens % PAGE_SIZE
    slots = block_ids * PAGE_SIZE + offsets
    scale_offsets = (block_ids * num_kv_heads + kv_head) * PAGE_SIZE + offsets
    kv_offsets = slots[:, None] * stride_cache_token + kv_head * stride_cache_head + dims[None, :]
    # e4m3 values are exact in q's dtype; FP8 scales are applied after the dots.
    k = tl.load(k_cache_ptr + kv_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    v = tl.load(v_cache_ptr + kv_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    return k, v, scale_offsets


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
