"""y = x W^T (+ b) for the few rows of a small decode batch: a weight-streaming matmul.

At batch 1..16 a projection reads its whole weight to produce a handful of rows, so it is bound by
HBM read bandwidth. Each program streams one block of BLOCK_N weight rows along K once, in
BLOCK_K-wide pipelined tiles, and multiplies them against all of x's rows (padded to the 16 rows
tl.dot needs): no split-K partial sums, no second kernel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_same_device,
    expect_shape,
)
from llm_engine.kernels.launch_config import interpreting, launch_params

# x rows one program covers: tl.dot's smallest M. Larger batches go to cuBLAS.
SKINNY_MAX_ROWS = 16


def fits_skinny_matmul(x: torch.Tensor) -> bool:
    """Whether x's rows are few enough for the kernel on its device (launch config `max_rows`;
    0 where cuBLAS is faster at every batch)."""
    max_rows = launch_params("skinny_matmul", x.device, x.dtype)["max_rows"]
    return 0 < x.shape[0] <= min(max_rows, SKINNY_MAX_ROWS)


def skinny_matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= SKINNY_MAX_ROWS), weight [N, K], bias [N] -> x W^T + b as [M, N]."""
    _check_args(x, weight, bias)
    return F.linear(x, weight, bias)


# The row count changes with the batch: not specialised on, so one variant per weight shape.
@triton.jit(do_not_specialize=["M"])
def _skinny_matmul_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,
    M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        if EVEN_K:  # no mask along K: full-width vector loads
            x_mask = row_mask[:, None]
            w_mask = col_mask[:, None]
        else:
            x_mask = row_mask[:, None] & (ks < K)[None, :]
            w_mask = col_mask[:, None] & (ks < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=w_mask, other=0.0)
        # The interpreter's tl.dot multiplies bf16's raw uint16 storage; float32 dots sidestep it.
        if UPCAST_DOT:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & col_mask[None, :])


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M <= SKINNY_MAX_ROWS), weight [N, K], bias [N] -> x W^T + b as [M, N]."""
    _check_args(x, weight, bias)
    expect_launchable("x", x, "skinny_matmul_ref")
    (num_rows, k), n = x.shape, weight.shape[0]
    out = torch.empty((num_rows, n), dtype=x.dtype, device=x.device)
    if num_rows == 0 or n == 0:
        return out
    params = launch_params("skinny_matmul", x.device, x.dtype)
    block_n, block_k = params["BLOCK_N"], min(params["BLOCK_K"], max(16, triton.next_power_of_2(k)))
    _skinny_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, weight, weight if bias is None else bias, out,
        num_rows, n, k, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=SKINNY_MAX_ROWS,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and x.dtype == torch.bfloat16,
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
    )
    return out


def _check_args(x, weight, bias) -> None:
    expect_ndim("x", x, 2, "[rows, in_features]")
    expect_ndim("weight", weight, 2, "[out_features, in_features]")
    if x.shape[0] > SKINNY_MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; skinny_matmul takes at most {SKINNY_MAX_ROWS}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features but weight takes {weight.shape[1]}")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"x, weight and bias must share one dtype, got {x.dtype}, {weight.dtype}"
                         f"{'' if bias is None else f', {bias.dtype}'}")
    expect_last_dim_contiguous("x", x)
    expect_last_dim_contiguous("weight", weight)
    if bias is not None:
        expect_shape("bias", bias, (weight.shape[0],))
        expect_same_device(x=x, weight=weight, bias=bias)
    else:
        expect_same_device(x=x, weight=weight)
