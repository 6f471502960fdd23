"""SwiGLU gate: silu(gate) * up on the fused [gate | up] projection output."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import expect_last_dim_contiguous, expect_launchable, expect_ndim
from llm_engine.kernels.launch_config import launch_params


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2*I] -> silu(x[:, :I]) * x[:, I:] as [T, I]."""
    check_gated_input(x)
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_out, intermediate_size,
    BLOCK_I: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < intermediate_size
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + intermediate_size + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2*I] -> silu(x[:, :I]) * x[:, I:] as [T, I]."""
    check_gated_input(x)
    expect_launchable("x", x, "silu_and_mul_ref")
    num_tokens, double_size = x.shape
    intermediate_size = double_size // 2
    out = torch.empty((num_tokens, intermediate_size), dtype=x.dtype, device=x.device)
    if num_tokens and intermediate_size:
        params = launch_params("silu_and_mul", x.device)
        block_i = min(params["BLOCK_I"], triton.next_power_of_2(intermediate_size))
        grid = (num_tokens, triton.cdiv(intermediate_size, block_i))
        _silu_and_mul_kernel[grid](
            x, out, x.stride(0), out.stride(0), intermediate_size,
            BLOCK_I=block_i, num_warps=params["num_warps"],
        )
    return out


def check_gated_input(x) -> None:
    """x [num_tokens, 2 * intermediate_size], last dim contiguous (also fp8_quant.silu_and_mul_quantize_fp8's)."""
    expect_ndim("x", x, 2, "[num_tokens, 2 * intermediate_size]")
    if x.shape[1] % 2:
        raise ValueError(f"x's last dim must be even (gate and up halves), got {x.shape[1]}")
    expect_last_dim_contiguous("x", x)
