"""FP8 (e4m3) quantization of linear weights and activations, W8A8 as vLLM's "FP8 dynamic" scheme:

- weights per output channel: each row of W [N, K] gets scale = amax(|row|) * float32(1 / 448) and is
  stored as e4m3 values row / scale (quantize_fp8_weight_ref; done once, at load or by the checkpoint
  writer);
- activations per token, dynamically: each row of x [M, K] likewise at every call
  (quantize_fp8_per_token, a Triton kernel), or with one static scale for all rows when a
  checkpoint brings an `input_scale`. The down projection's input, silu(gate) * up, is quantized by the
  kernel that computes it (silu_and_mul_quantize_fp8), as the qkv and gate_up inputs are by the norm's
  (rms_norm.rms_norm_quantize_fp8): the rows are not written in bf16 and read back (the separate quantizer
  took 6% of a step of workload (b) with FP8 weights).

The roundings are those of kv_store.quantize_fp8_ref (the FP8 KV cache's): the scale one float32
multiplication of amax by float32(1 / 448) (kv_store.fp8_scale_ref: not `amax / 448`, which torch
computes one way on CUDA and another on the CPU), x / scale correctly rounded, clamped to +-448, rounded
to the nearest e4m3 value, ties to even. The kernels reproduce them bit for bit on every device
(kv_store.fp8_scale and kv_store.to_e4m3: the same multiplication, div_rn, ties to even), so their bytes
and scales equal the reference's. That matters beyond the last bit of a scale: bf16 inputs often sit exactly
halfway between two e4m3 values of their row's grid, and a scale one ulp off rounds those the other way, a
whole e4m3 step (up to 1/8 of the value).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels.activation import check_gated_input, silu_and_mul_ref
from llm_engine.kernels._validate import (
    expect_dtype,
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_same_device,
)
from llm_engine.kernels.kv_store import (
    FP8_E4M3_MAX,
    FP8_SCALE_MIN,
    fp8_scale,
    quantize_fp8_ref,
    to_e4m3,
)
from llm_engine.kernels.launch_config import launch_params

FP8 = torch.float8_e4m3fn
ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def quantize_fp8_weight_ref(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] (any float dtype) -> (e4m3 values [N, K], float32 scales [N]), per output channel."""
    expect_ndim("weight", weight, 2, "[out_features, in_features]")
    return quantize_fp8_ref(weight)


def dequantize_fp8_weight_ref(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """quantize_fp8_weight_ref's inverse, in float32."""
    return values.float() * scale.float()[:, None]


def quantize_fp8_per_token_ref(x: torch.Tensor, static_scale: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 values [M, K], float32 scales [M]): per row amax * float32(1 / 448), or
    `static_scale` (a float32 scalar: every row's scale) when given."""
    _check_args(x, static_scale)
    if static_scale is None:
        return quantize_fp8_ref(x)
    scale = static_scale.float().reshape(()).expand(x.shape[0]).contiguous()
    values = (x.float() / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return values.to(FP8), scale


def silu_and_mul_quantize_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, 2 * I] ([gate | up]) -> quantize_fp8_per_token_ref(silu_and_mul_ref(x)): (e4m3 [M, I], float32 [M])."""
    return quantize_fp8_per_token_ref(silu_and_mul_ref(x))


@triton.jit
def _quantize_per_token_kernel(
    x_ptr, out_ptr, scale_ptr, static_scale_ptr,
    stride_x, stride_out, K,
    BLOCK_K: tl.constexpr,
    ONE_TILE: tl.constexpr,
    STATIC: tl.constexpr,
    GATED: tl.constexpr,
):
    """One row per program: its amax over K (a first pass; the second reads the row again from L1/L2),
    then its e4m3 values. ONE_TILE: the row fits one tile and is read once. GATED: the row is
    silu(gate) * up of x's [gate | up] (K wide each), rounded to x's dtype as silu_and_mul rounds it."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    ks = tl.arange(0, BLOCK_K)
    if ONE_TILE:
        x = _row_tile(x_row, ks, ks < K, K, GATED)
    if STATIC:
        scale = tl.load(static_scale_ptr)
    else:
        if ONE_TILE:
            amax = tl.max(tl.abs(x), axis=0)
        else:
            running = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k_start in range(0, K, BLOCK_K):
                tile = _row_tile(x_row, k_start + ks, k_start + ks < K, K, GATED)
                running = tl.maximum(running, tl.abs(tile))
            amax = tl.max(running, axis=0)
        scale = fp8_scale(amax)  # no division: torch's own `/ 448` differs between devices
    tl.store(scale_ptr + row, scale)
    if ONE_TILE:
        q = to_e4m3(x, scale)
        tl.store(out_row + ks, q.to(out_ptr.dtype.element_ty), mask=ks < K)
    else:
        for k_start in range(0, K, BLOCK_K):
            mask = k_start + ks < K
            tile = _row_tile(x_row, k_start + ks, mask, K, GATED)
            q = to_e4m3(tile, scale)
            tl.store(out_row + k_start + ks, q.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_tile(x_row, ks, mask, K, GATED: tl.constexpr):
    """The row's columns ks in float32; GATED: silu(gate) * up from [gate | up], in silu_and_mul's arithmetic."""
    if GATED:
        gate = tl.load(x_row + ks, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + K + ks, mask=mask, other=0.0).to(tl.float32)
        return (gate * tl.sigmoid(gate) * up).to(x_row.dtype.element_ty).to(tl.float32)
    return tl.load(x_row + ks, mask=mask, other=0.0).to(tl.float32)


def quantize_fp8_per_token(x: torch.Tensor, static_scale: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 values [M, K], float32 scales [M]): per row amax * float32(1 / 448), or
    `static_scale` (a float32 scalar: every row's scale) when given. One launch."""
    _check_args(x, static_scale)
    expect_launchable("x", x, "quantize_fp8_per_token_ref")
    return _quantize(x, x.shape[1], static_scale, "quantize_fp8_per_token")


def silu_and_mul_quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, 2 * I] ([gate | up]) -> silu_and_mul_quantize_fp8_ref's (e4m3 [M, I], float32 [M]), bit for bit
    what silu_and_mul then quantize_fp8_per_token give. One launch."""
    check_gated_input(x)
    expect_dtype("x", x, ACTIVATION_DTYPES)
    expect_launchable("x", x, "silu_and_mul_quantize_fp8_ref")
    return _quantize(x, x.shape[1] // 2, None, "silu_and_mul_quantize_fp8")


def _quantize(x: torch.Tensor, k: int, static_scale: torch.Tensor | None, kernel: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of k values from x (gated when x is twice as wide) -> (e4m3 [M, k], float32 scales [M])."""
    num_rows = x.shape[0]
    values = torch.empty((num_rows, k), dtype=FP8, device=x.device)
    scale = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    if num_rows == 0 or k == 0:
        return values, scale.fill_(FP8_SCALE_MIN)
    params = launch_params(kernel, x.device)
    block_k = min(params["BLOCK_K"], triton.next_power_of_2(k))
    _quantize_per_token_kernel[(num_rows,)](
        x, values, scale, scale if static_scale is None else static_scale,
        x.stride(0), values.stride(0), k,
        BLOCK_K=block_k,
        ONE_TILE=k <= block_k,
        STATIC=static_scale is not None,
        GATED=x.shape[1] != k,
        num_warps=params["num_warps"],
    )
    return values, scale


def _check_args(x: torch.Tensor, static_scale: torch.Tensor | None) -> None:
    expect_ndim("x", x, 2, "[rows, features]")
    expect_dtype("x", x, ACTIVATION_DTYPES)
    expect_last_dim_contiguous("x", x)
    if static_scale is not None:
        if static_scale.numel() != 1:
            raise ValueError(f"static_scale must hold one value, got shape {tuple(static_scale.shape)}")
        expect_dtype("static_scale", static_scale, (torch.float32,))
    expect_same_device(x=x, static_scale=static_scale)
