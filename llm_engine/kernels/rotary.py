"""Rotary position embedding, NeoX / HF-Llama layout (rotate_half over the two head-dim halves)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_dtype,
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_power_of_two,
    expect_same_device,
    expect_shape,
)
from llm_engine.kernels.launch_config import launch_params


def apply_rotary_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by positions [T]; cos_sin_cache [max_pos, D] = [cos | sin].

    Returns new tensors in the input dtypes; q and k are not modified.
    """
    _check_args(q, k, positions, cos_sin_cache)
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_src_h, stride_dst_h, num_heads, cos, sin,
                  HALF_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, HALF_DIM)[None, :]
    mask = heads < num_heads
    x1 = tl.load(src_ptr + heads * stride_src_h + dims, mask=mask).to(tl.float32)
    x2 = tl.load(src_ptr + heads * stride_src_h + HALF_DIM + dims, mask=mask).to(tl.float32)
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst_ptr + heads * stride_dst_h + dims, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
    tl.store(dst_ptr + heads * stride_dst_h + HALF_DIM + dims, (x2 * cos + x1 * sin).to(out_ty), mask=mask)


@triton.jit
def _apply_rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, positions_ptr, cos_sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh, stride_cos_sin,
    num_q_heads, num_kv_heads,
    HALF_DIM: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    dims = tl.arange(0, HALF_DIM)[None, :]
    cos = tl.load(cos_sin_ptr + position * stride_cos_sin + dims)
    sin = tl.load(cos_sin_ptr + position * stride_cos_sin + HALF_DIM + dims)
    _rotate_heads(q_ptr + token * stride_qt, q_out_ptr + token * stride_qot, stride_qh, stride_qoh,
                  num_q_heads, cos, sin, HALF_DIM, BLOCK_Q_HEADS)
    _rotate_heads(k_ptr + token * stride_kt, k_out_ptr + token * stride_kot, stride_kh, stride_koh,
                  num_kv_heads, cos, sin, HALF_DIM, BLOCK_KV_HEADS)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by positions [T]; cos_sin_cache [max_pos, D] = [cos | sin].

    Returns new tensors in the input dtypes; q and k are not modified.
    """
    _check_args(q, k, positions, cos_sin_cache)
    expect_launchable("q", q, "apply_rotary_ref")
    num_tokens, num_q_heads, head_dim = q.shape
    expect_power_of_two("head_dim", head_dim, 2)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if num_tokens:
        params = launch_params("apply_rotary", q.device)
        _apply_rotary_kernel[(num_tokens,)](
            q, k, q_out, k_out, positions, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
            num_q_heads, k.shape[1],
            HALF_DIM=head_dim // 2,
            BLOCK_Q_HEADS=triton.next_power_of_2(num_q_heads),
            BLOCK_KV_HEADS=triton.next_power_of_2(k.shape[1]),
            num_warps=params["num_warps"],
        )
    return q_out, k_out


def _check_args(q, k, positions, cos_sin_cache) -> None:
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
