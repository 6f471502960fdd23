"""RMSNorm, optionally fused with the residual add that precedes it in a transformer block, and, for a
projection with FP8 weights and per-token activation scales, with the quantization after it
(rms_norm_quantize_fp8: the normed rows are not written in the model's dtype and read back)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_same_device,
    expect_shape,
    output_like,
)
from llm_engine.kernels.fp8_quant import FP8, quantize_fp8_per_token_ref
from llm_engine.kernels.kv_store import fp8_scale, to_e4m3
from llm_engine.kernels.launch_config import launch_params


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> rmsnorm(x) * weight; with residual -> (rmsnorm(x + residual) * weight, residual),
    residual updated in place to x + residual. `out`: where the normed rows go."""
    _check_args(x, weight, residual)
    out = output_like(out, x)
    if residual is not None:
        residual.copy_((x.float() + residual.float()).to(x.dtype))
        x = residual
    xf = x.float()
    out.copy_(xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float())
    return out if residual is None else (out, residual)


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr, scale_ptr,
    stride_x, stride_residual, stride_out, stride_new_residual,
    hidden_size, eps,
    BLOCK_H: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANTIZE: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to x's dtype first: the stored residual and the normed value must agree.
        summed = (x + r).to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * stride_new_residual + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    # The squares are exact in float64 and summed there, so the float32 mean square practically never depends
    # on the order the compiled layout adds in: QUANTIZE's e4m3 store gives a thread 16 values instead of 8,
    # and float32 sums then came out an ulp apart in some rows (the e4m3 bytes one step apart).
    x64 = x.to(tl.float64)
    mean_square = (tl.sum(x64 * x64, axis=0) / hidden_size).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = x * tl.math.rsqrt(mean_square + eps) * w
    if QUANTIZE:  # as rms_norm's output in x's dtype, then fp8_quant's per-token quantizer
        out = out.to(x_ptr.dtype.element_ty).to(tl.float32)
        scale = fp8_scale(tl.max(tl.abs(out), axis=0))
        tl.store(scale_ptr + row, scale)
        out = to_e4m3(out, scale)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] -> rmsnorm(x) * weight; with residual -> (rmsnorm(x + residual) * weight, residual),
    residual updated in place to x + residual (each program reads its row before writing it).
    `out`: where the normed rows go."""
    _check_args(x, weight, residual)
    expect_launchable("x", x, "rms_norm_ref")
    out = output_like(out, x)
    _launch(x, weight, eps, residual, out, None)
    return out if residual is None else (out, residual)


def rms_norm_quantize_fp8_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                              residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_ref's normed rows quantized per token (fp8_quant.quantize_fp8_per_token_ref): (e4m3 [T, H],
    float32 scales [T]); residual, given, updated in place as rms_norm_ref updates it."""
    normed = rms_norm_ref(x, weight, eps, residual)
    return quantize_fp8_per_token_ref(normed if residual is None else normed[0])


def rms_norm_quantize_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float,
                          residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_quantize_fp8_ref's result as rms_norm then quantize_fp8_per_token give it, bit for bit, in one
    launch."""
    _check_args(x, weight, residual)
    expect_launchable("x", x, "rms_norm_quantize_fp8_ref")
    values = torch.empty(x.shape, dtype=FP8, device=x.device)
    scale = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    _launch(x, weight, eps, residual, values, scale)
    return values, scale


def _launch(x, weight, eps, residual, out, scale) -> None:
    """One program per row; `scale` given: out is e4m3 and the row's scale goes there."""
    num_tokens, hidden_size = x.shape
    if not num_tokens:
        return
    has_residual = residual is not None
    residual_arg = residual if has_residual else x
    new_residual = residual if has_residual else x  # (not written without a residual)
    params = launch_params("rms_norm", x.device)
    _rms_norm_kernel[(num_tokens,)](
        x, residual_arg, weight, out, new_residual, out if scale is None else scale,
        x.stride(0), residual_arg.stride(0), out.stride(0), new_residual.stride(0),
        hidden_size, eps,
        BLOCK_H=triton.next_power_of_2(hidden_size),
        HAS_RESIDUAL=has_residual,
        QUANTIZE=scale is not None,
        num_warps=params["num_warps"],
        # Every product and sum rounded on its own (`.rn` in the PTX): with fusion, ptxas may fuse a multiply
        # into an add differently in each compiled variant, and the quantizing one should give the plain
        # one's bytes.
        enable_fp_fusion=False,
    )


def _check_args(x, weight, residual) -> None:
    expect_ndim("x", x, 2, "[num_tokens, hidden_size]")
    expect_shape("weight", weight, (x.shape[1],))
    expect_last_dim_contiguous("x", x)
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    if residual is not None:
        expect_shape("residual", residual, x.shape)
        expect_last_dim_contiguous("residual", residual)
    expect_same_device(x=x, weight=weight, residual=residual)
