"""Paged KV cache: the reference writer and reader, FP8 quantization, and the per-token store that
the fused rotary + KV-cache-write kernel (rotary_kv_cache.py) uses.

Layout per layer: k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim];
token slot = block_id * block_size + offset. FP8 (e4m3fn) caches carry float32 scales
[num_blocks, block_size, num_kv_heads], one per (token, kv head). dequantize_kv_blocks copies the FP8
blocks a batch of sequences reads into a 16-bit scratch cache (prefill_attention.py's large chunks).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_dtype,
    expect_kv_scales,
    expect_last_dim_contiguous,
    expect_ndim,
    expect_shape,
)

FP8_E4M3_MAX = 448.0
# 1 / 448 rounded to float32 (exactly this Python float). Every FP8 scale is amax * FP8_E4M3_INV_MAX, one
# correctly rounded float32 multiplication, in the torch references and in the kernels alike, so they agree
# bit for bit on every device. `amax / 448` does not: on CUDA torch divides by a Python number as a multiply
# by its float32 reciprocal, on the CPU it divides, and the two differ by an ulp in about half the rows
# (the H200 run of 2026-12-04: scales an ulp apart, and e4m3 ties of bf16 inputs rounded the other way).
FP8_E4M3_INV_MAX = 0.0022321429569274187
FP8_E4M3_INV_MAX_C = tl.constexpr(FP8_E4M3_INV_MAX)  # the same, for the kernels
# Keeps the scale of an all-zero head finite (x / scale stays 0 instead of NaN).
FP8_SCALE_MIN = 1e-12
KV_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def fp8_scale_ref(amax: torch.Tensor) -> torch.Tensor:
    """The FP8 scale of values whose largest magnitude is amax: amax * float32(1 / 448), at least
    FP8_SCALE_MIN, in float32 (FP8_E4M3_INV_MAX: the same bits on every device and in the kernels)."""
    return (amax.float() * FP8_E4M3_INV_MAX).clamp(min=FP8_SCALE_MIN)


def quantize_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (e4m3fn values, float32 scales [...]) with scale = amax(|x|) * float32(1 / 448)
    (fp8_scale_ref) and values x / scale (a tensor divisor: correctly rounded on every device)."""
    xf = x.float()
    scale = fp8_scale_ref(xf.abs().amax(dim=-1))
    values = (xf / scale[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return values.to(torch.float8_e4m3fn), scale


def dequantize_fp8_ref(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return values.float() * scale[..., None]


def quantize_fp8_cache_ref(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled cache [blocks, block_size, Hkv, D] -> (e4m3fn values, float32 scales in the cache's
    [blocks, Hkv, block_size] layout)."""
    values, scale = quantize_fp8_ref(cache)
    return values, scale.transpose(1, 2).contiguous()


def dequantize_fp8_cache_ref(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """quantize_fp8_cache_ref's inverse: float32 [blocks, block_size, Hkv, D]."""
    return dequantize_fp8_ref(values, scale.transpose(1, 2))


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k, v [T, Hkv, D] into the caches at slot_mapping [T] (slot < 0: skip), in place."""
    check_write_args(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for new, cache, scale in ((k[keep], k_cache, k_scale), (v[keep], v_cache, v_scale)):
        flat = cache.view(-1, *cache.shape[2:])
        if cache.dtype == torch.float8_e4m3fn:
            values, new_scale = quantize_fp8_ref(new)
            # index_put has no float8 kernel on every backend; the bytes are what matters.
            flat.view(torch.uint8)[slots] = values.view(torch.uint8)
            scale[slots // cache.shape[1], :, slots % cache.shape[1]] = new_scale  # [block, head, offset]
        else:
            flat[slots] = new.to(cache.dtype)


def gather_kv_ref(
    cache: torch.Tensor,
    scale: torch.Tensor | None,
    block_table: torch.Tensor,
    context_len: int,
) -> torch.Tensor:
    """One sequence's first context_len cached tokens as float32 [context_len, Hkv, D]."""
    return gather_kv_batch_ref(cache, scale, block_table[None], context_len)[0]


def gather_kv_batch_ref(
    cache: torch.Tensor,
    scale: torch.Tensor | None,
    block_tables: torch.Tensor,
    length: int,
) -> torch.Tensor:
    """The first `length` token slots of each block-table row as float32 [B, length, Hkv, D]
    (slots past a sequence's context hold whatever their block does)."""
    block_size = cache.shape[1]
    blocks = block_tables[:, : triton.cdiv(length, block_size)].long()
    # Gather bytes, not float8 values: index_select has no float8 kernel on every backend.
    raw = cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache
    tokens = raw[blocks].flatten(1, 2)[:, :length].view(cache.dtype).float()
    if scale is not None:
        tokens = tokens * scale[blocks].transpose(-1, -2).flatten(1, 2)[:, :length, :, None]
    return tokens


@triton.jit
def _round_to_e4m3(y):
    """Round float32 y (|y| <= 448) to the nearest e4m3 value, ties to even, in float32.

    The cast of an already representable value is exact everywhere; the interpreter's own
    float32 -> e4m3 cast loses the carry when rounding overflows the mantissa (1.97 -> 1.0).
    """
    exponent = (y.to(tl.int32, bitcast=True) >> 23) & 0xFF
    # e4m3 has 3 mantissa bits; below 2^-6 it is subnormal with a fixed step of 2^-9.
    exponent = tl.maximum(exponent, 127 - 6)
    step = ((exponent - 3) << 23).to(tl.float32, bitcast=True)
    inverse_step = ((257 - exponent) << 23).to(tl.float32, bitcast=True)
    # |y / step| < 16: adding and removing 1.5 * 2^23 rounds it to an integer, ties to even.
    steps = (y * inverse_step + 12582912.0) - 12582912.0
    # y's sign put back: that sum makes a negative y that rounds to 0 a +0, where the cast gives -0 (0x80)
    sign = y.to(tl.int32, bitcast=True) & -2147483648
    return ((steps * step).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def fp8_scale(amax):
    """fp8_scale_ref in a kernel: amax * float32(1 / 448), one rounding, at least FP8_SCALE_MIN."""
    return tl.maximum(amax * FP8_E4M3_INV_MAX_C, 1e-12)


@triton.jit
def to_e4m3(x, scale):
    """x / scale correctly rounded (as torch divides by a tensor), clamped to +-448 and rounded to the nearest
    e4m3 value, in float32: with fp8_scale, quantize_fp8_ref's bytes exactly on every device."""
    return _round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -448.0, 448.0))


@triton.jit
def store_token_heads(x1, x2, cache_ptr, scale_ptr, slot, stride_slot, stride_head, num_kv_heads,
                      HALF_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr, PAGE_SIZE: tl.constexpr,
                      IS_FP8: tl.constexpr):
    """One token's kv heads, float32 halves [BLOCK_HEADS, HALF_DIM] of the head dim, into its cache
    slot: cast to the cache dtype, or for FP8 quantized per head (scale = amax * float32(1 / 448)) with the
    scale stored in the [block, kv head, offset] layout."""
    heads = tl.arange(0, BLOCK_HEADS)
    dims = tl.arange(0, HALF_DIM)[None, :]
    head_mask = heads < num_kv_heads
    mask = head_mask[:, None]
    dst = cache_ptr + slot * stride_slot + heads[:, None] * stride_head + dims
    if IS_FP8:
        amax = tl.maximum(tl.max(tl.abs(x1), axis=1), tl.max(tl.abs(x2), axis=1))
        scale = fp8_scale(amax)
        x1 = to_e4m3(x1, scale[:, None])
        x2 = to_e4m3(x2, scale[:, None])
        tl.store(scale_ptr + ((slot // PAGE_SIZE) * num_kv_heads + heads) * PAGE_SIZE + slot % PAGE_SIZE, scale,
                 mask=head_mask)
    tl.store(dst, x1.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF_DIM, x2.to(cache_ptr.dtype.element_ty), mask=mask)


def dequantize_kv_blocks_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FP8 blocks each sequence's context reads, dequantized into a scratch cache of `dtype`:
    (k, v [B * W, block_size, Hkv, D], block tables [B, W] int32 numbering them in order), W the
    tables' width. Blocks past a sequence's context are left unwritten (nothing reads them)."""
    check_dequantize_args(k_cache, v_cache, k_scale, v_scale, block_tables, context_lens)
    batch, width = block_tables.shape
    block_size = k_cache.shape[1]
    used = torch.arange(width, device=block_tables.device)[None, :] * block_size < context_lens[:, None].long()
    blocks = block_tables.long()[used]
    outs = []
    for cache, scale in ((k_cache, k_scale), (v_cache, v_scale)):
        out = torch.empty((batch * width, *cache.shape[1:]), dtype=dtype, device=cache.device)
        raw = cache.view(torch.uint8)[blocks].view(cache.dtype)  # index_select has no float8 kernel everywhere
        out[used.flatten()] = dequantize_fp8_cache_ref(raw, scale[blocks]).to(dtype)
        outs.append(out)
    tables = torch.arange(batch * width, dtype=torch.int32, device=block_tables.device).view(batch, width)
    return outs[0], outs[1], tables


@triton.jit(do_not_specialize=["width"])
def _dequantize_blocks_kernel(
    k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, block_tables_ptr, context_lens_ptr, k_out_ptr, v_out_ptr,
    stride_bt, width, num_kv_heads,
    PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    """One block of one sequence per program: its (token, kv head) rows of K, then of V, times their scales."""
    seq = tl.program_id(0)
    j = tl.program_id(1)
    if j * PAGE_SIZE < tl.load(context_lens_ptr + seq):
        block = tl.load(block_tables_ptr + seq * stride_bt + j).to(tl.int64)
        rows = tl.arange(0, BLOCK_ROWS)  # token * num_kv_heads + head, as the block stores them
        row_mask = rows < PAGE_SIZE * num_kv_heads
        offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        src = block * PAGE_SIZE * num_kv_heads * HEAD_DIM + offsets
        dst = (seq * width + j).to(tl.int64) * PAGE_SIZE * num_kv_heads * HEAD_DIM + offsets
        # Scales are [block, kv head, offset]: row (token t, head h) has scale h * PAGE_SIZE + t.
        scale_offsets = block * num_kv_heads * PAGE_SIZE + (rows % num_kv_heads) * PAGE_SIZE + rows // num_kv_heads
        k = tl.load(k_cache_ptr + src, mask=row_mask[:, None], other=0.0).to(tl.float32)
        k_scale = tl.load(k_scale_ptr + scale_offsets, mask=row_mask, other=0.0)
        tl.store(k_out_ptr + dst, (k * k_scale[:, None]).to(k_out_ptr.dtype.element_ty), mask=row_mask[:, None])
        v = tl.load(v_cache_ptr + src, mask=row_mask[:, None], other=0.0).to(tl.float32)
        v_scale = tl.load(v_scale_ptr + scale_offsets, mask=row_mask, other=0.0)
        tl.store(v_out_ptr + dst, (v * v_scale[:, None]).to(v_out_ptr.dtype.element_ty), mask=row_mask[:, None])


def dequantize_kv_blocks(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dequantize_kv_blocks_ref in one launch (a program per table entry; those past the context exit)."""
    check_dequantize_args(k_cache, v_cache, k_scale, v_scale, block_tables, context_lens)
    batch, width = block_tables.shape
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    k_out = torch.empty((batch * width, block_size, num_kv_heads, head_dim), dtype=dtype, device=k_cache.device)
    v_out = torch.empty_like(k_out)
    tables = torch.arange(batch * width, dtype=torch.int32, device=block_tables.device).view(batch, width)
    if batch and width:
        _dequantize_blocks_kernel[(batch, width)](
            k_cache, v_cache, k_scale, v_scale, block_tables, context_lens, k_out, v_out,
            block_tables.stride(0), width, num_kv_heads,
            PAGE_SIZE=block_size,
            HEAD_DIM=head_dim,
            BLOCK_ROWS=triton.next_power_of_2(block_size * num_kv_heads),
            num_warps=4,
        )
    return k_out, v_out, tables


def check_dequantize_args(k_cache, v_cache, k_scale, v_scale, block_tables, context_lens) -> None:
    expect_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    expect_shape("v_cache", v_cache, k_cache.shape)
    expect_dtype("k_cache", k_cache, (torch.float8_e4m3fn,))
    expect_dtype("v_cache", v_cache, (torch.float8_e4m3fn,))
    expect_kv_scales(k_cache, k_scale, v_scale)
    expect_ndim("block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    expect_shape("context_lens", context_lens, (block_tables.shape[0],))
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    expect_last_dim_contiguous("block_tables", block_tables)


def check_write_args(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale) -> None:
    expect_ndim("k", k, 3, "[num_tokens, num_kv_heads, head_dim]")
    expect_shape("v", v, k.shape)
    expect_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    expect_shape("v_cache", v_cache, k_cache.shape)
    if tuple(k_cache.shape[2:]) != tuple(k.shape[1:]):
        raise ValueError(
            f"k_cache [num_kv_heads, head_dim] must be {tuple(k.shape[1:])}, got {tuple(k_cache.shape[2:])}"
        )
    expect_dtype("k_cache", k_cache, KV_CACHE_DTYPES)
    expect_dtype("v_cache", v_cache, (k_cache.dtype,))
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    expect_shape("slot_mapping", slot_mapping, (k.shape[0],))
    expect_dtype("slot_mapping", slot_mapping, (torch.int64, torch.int32))
    expect_last_dim_contiguous("k", k)
    expect_last_dim_contiguous("v", v)
    expect_kv_scales(k_cache, k_scale, v_scale)
