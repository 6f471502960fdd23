"""Rotary position embedding, NeoX / HF-Llama layout (rotate_half over the two head-dim halves): the
torch reference and the rotation that the fused rotary + KV-cache-write kernel (rotary_kv_cache.py) applies."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_dtype,
    expect_last_dim_contiguous,
    expect_ndim,
    expect_same_device,
    expect_shape,
)


def apply_rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by positions [T]; cos_sin_cache [max_pos, D] = [cos | sin].

    Returns new tensors in the input dtypes; q and k are not modified.
    """
    check_rotary_args(q, k, positions, cos_sin_cache)
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


@triton.jit
def rotate_heads(src_ptr, stride_h, num_heads, cos, sin, HALF_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    """One token's heads (rows stride_h apart) rotated by cos, sin [1, HALF_DIM], in float32 and
    rounded to the source dtype, as apply_rotary_ref returns them: (first halves, second halves)
    [BLOCK_HEADS, HALF_DIM], rows past num_heads zero."""
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, HALF_DIM)[None, :]
    mask = heads < num_heads
    x1 = tl.load(src_ptr + heads * stride_h + dims, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + heads * stride_h + HALF_DIM + dims, mask=mask, other=0.0).to(tl.float32)
    src_ty = src_ptr.dtype.element_ty
    return (x1 * cos - x2 * sin).to(src_ty).to(tl.float32), (x2 * cos + x1 * sin).to(src_ty).to(tl.float32)


def check_rotary_args(q, k, positions, cos_sin_cache) -> None:
    expect_ndim("q", q, 3, "[num_tokens, num_q_heads, head_dim]")
    expect_ndim("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k must be [{q.shape[0]}, num_kv_heads, {q.shape[2]}], got {tuple(k.shape)}")
    expect_shape("positions", positions, (q.shape[0],))
    expect_dtype("positions", positions, (torch.int64, torch.int32))
    expect_ndim("cos_sin_cache", cos_sin_cache, 2, "[max_position, head_dim]")
    if cos_sin_cache.shape[1] != q.shape[2]:
        raise ValueError(f"cos_sin_cache's rotary_dim must equal head_dim {q.shape[2]}, got {cos_sin_cache.shape[1]}")
    expect_dtype("cos_sin_cache", cos_sin_cache, (torch.float32,))
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        expect_last_dim_contiguous(name, t)
    expect_same_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
