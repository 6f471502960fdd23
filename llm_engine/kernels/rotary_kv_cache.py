"""Rotary embedding and the paged KV-cache write of a step's new tokens, in one kernel.

Attention reads K only from the cache, so the rotated K never needs a tensor of its own: one
program per token rotates its query heads into a new q, and its key heads on their way into the
cache slot, with V (FP8 caches: quantized per head). One launch instead of two per layer: at small
batches a decode step is mostly launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import expect_launchable, expect_power_of_two, expect_same_device, output_like
from llm_engine.kernels.kv_store import check_write_args, store_token_heads, write_kv_cache_ref
from llm_engine.kernels.launch_config import launch_params
from llm_engine.kernels.rotary import apply_rotary_ref, check_rotary_args, rotate_heads


def rotary_and_write_kv_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by positions [T] (cos_sin_cache [max_pos, D] =
    [cos | sin]); write the rotated k and v [T, Hkv, D] into the caches at slot_mapping [T]
    (slot < 0: skip), in place. Returns the rotated q, in `q_out` if given (else a new tensor);
    q, k, v are not modified."""
    # The two halves check their own arguments (on the CPU this runs for every layer of every step).
    q_rot, k_rot = apply_rotary_ref(q, k, positions, cos_sin_cache)
    write_kv_cache_ref(k_rot, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    return q_rot if q_out is None else output_like(q_out, q, "q_out").copy_(q_rot)


@triton.jit
def _rotary_and_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, positions_ptr, cos_sin_ptr, slot_ptr,
    k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_qot, stride_qoh, stride_cos_sin,
    stride_cache_slot, stride_cache_head,
    num_q_heads, num_kv_heads,
    HALF_DIM: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    token = tl.program_id(0)
    position = tl.load(positions_ptr + token)
    dims = tl.arange(0, HALF_DIM)[None, :]
    cos = tl.load(cos_sin_ptr + position * stride_cos_sin + dims)
    sin = tl.load(cos_sin_ptr + position * stride_cos_sin + HALF_DIM + dims)
    q1, q2 = rotate_heads(q_ptr + token * stride_qt, stride_qh, num_q_heads, cos, sin, HALF_DIM, BLOCK_Q_HEADS)
    q_dst = q_out_ptr + token * stride_qot + tl.arange(0, BLOCK_Q_HEADS)[:, None] * stride_qoh + dims
    q_mask = tl.arange(0, BLOCK_Q_HEADS)[:, None] < num_q_heads
    tl.store(q_dst, q1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_dst + HALF_DIM, q2.to(q_out_ptr.dtype.element_ty), mask=q_mask)

    slot = tl.load(slot_ptr + token)
    if slot >= 0:
        k1, k2 = rotate_heads(k_ptr + token * stride_kt, stride_kh, num_kv_heads, cos, sin, HALF_DIM,
                              BLOCK_KV_HEADS)
        store_token_heads(k1, k2, k_cache_ptr, k_scale_ptr, slot, stride_cache_slot, stride_cache_head,
                          num_kv_heads, HALF_DIM, BLOCK_KV_HEADS, PAGE_SIZE, IS_FP8)
        heads = tl.arange(0, BLOCK_KV_HEADS)[:, None]
        v_src = v_ptr + token * stride_vt + heads * stride_vh + dims
        v_mask = heads < num_kv_heads
        v1 = tl.load(v_src, mask=v_mask, other=0.0).to(tl.float32)
        v2 = tl.load(v_src + HALF_DIM, mask=v_mask, other=0.0).to(tl.float32)
        store_token_heads(v1, v2, v_cache_ptr, v_scale_ptr, slot, stride_cache_slot, stride_cache_head,
                          num_kv_heads, HALF_DIM, BLOCK_KV_HEADS, PAGE_SIZE, IS_FP8)


def rotary_and_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by positions [T] (cos_sin_cache [max_pos, D] =
    [cos | sin]); write the rotated k and v [T, Hkv, D] into the caches at slot_mapping [T]
    (slot < 0: skip), in place. Returns the rotated q, in `q_out` if given (else a new tensor);
    q, k, v are not modified."""
    _check_args(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    expect_launchable("q", q, "rotary_and_write_kv_ref")
    num_tokens, num_q_heads, head_dim = q.shape
    expect_power_of_two("head_dim", head_dim, 2)
    q_out = output_like(q_out, q, "q_out")
    if num_tokens == 0:
        return q_out
    is_fp8 = k_cache.dtype == torch.float8_e4m3fn
    num_kv_heads = k.shape[1]
    params = launch_params("rotary_and_write_kv", q.device)
    _rotary_and_write_kv_kernel[(num_tokens,)](
        q, k, v, q_out, positions, cos_sin_cache, slot_mapping,
        k_cache, v_cache, k_scale if is_fp8 else k_cache, v_scale if is_fp8 else v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos_sin_cache.stride(0),
        k_cache.stride(1), k_cache.stride(2),
        num_q_heads, num_kv_heads,
        HALF_DIM=head_dim // 2,
        BLOCK_Q_HEADS=triton.next_power_of_2(num_q_heads),
        BLOCK_KV_HEADS=triton.next_power_of_2(num_kv_heads),
        PAGE_SIZE=k_cache.shape[1],
        IS_FP8=is_fp8,
        num_warps=params["num_warps"],
    )
    return q_out


def _check_args(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    check_rotary_args(q, k, positions, cos_sin_cache)
    check_write_args(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    expect_same_device(q=q, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping, k_scale=k_scale,
                       v_scale=v_scale)
