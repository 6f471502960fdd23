"""The KV tile load that the decode and prefill attention kernels share."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_row_ptr, tokens, token_mask, kv_head, dims,
                 stride_cache_token, stride_cache_head, q, PAGE_SIZE: tl.constexpr):
    """K and V of `tokens` (positions in one sequence) for one kv head, through its block table,
    in q's dtype; also their cache slots (the FP8 scales' index)."""
    block_ids = tl.load(block_table_row_ptr + tokens // PAGE_SIZE, mask=token_mask, other=0)
    slots = block_ids.to(tl.int64) * PAGE_SIZE + tokens % PAGE_SIZE
    kv_offsets = slots[:, None] * stride_cache_token + kv_head * stride_cache_head + dims[None, :]
    # e4m3 values are exact in q's dtype; FP8 scales are applied after the dots.
    k = tl.load(k_cache_ptr + kv_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    v = tl.load(v_cache_ptr + kv_offsets, mask=token_mask[:, None], other=0.0).to(q.dtype)
    return k, v, slots
