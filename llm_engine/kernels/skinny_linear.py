"""y = x' W^T (+ b) for the few rows of a small decode batch, with the small ops around a projection fused in.

At batch 1..16 a projection reads its whole weight for a handful of rows: it is bound by HBM reads, and
the RMSNorm before it, the SwiGLU gate before the down projection and the residual add after the o and
down projections are separate launches of a few microseconds each (at batch 1 on Llama-3-8B the small
kernels, cuBLAS's split-K reduces among them, took 0.60 ms of 4.46 ms per token). Each program streams
BLOCK_N weight rows along K once, in BLOCK_K-wide pipelined tiles,
against all of x's rows (padded to the 16 rows tl.dot needs; a single row may instead be multiplied on the
CUDA cores, launch config `single_row_on_cuda_cores` with tiles from its "single_row" entry, each thread's
products summed along K only after the loop), and computes x' on the way:

- plain: x' = x;
- norm (norm_weight given): x' = rmsnorm(x) * norm_weight, each row's mean square taken in a first pass
  over x (x is a few KB, read from L2 by every program), its squares summed across threads once at the end;
- gated: x = [gate | up] and x' = silu(gate) * up.

With `swiglu` the SwiGLU gate goes after the projection instead: weight = [gate rows; up rows] and the output is
silu(gate) * up, half as wide. The MLP's gate_up projection ends with it, so the down projection reads the
activation instead of recomputing it from [gate | up] in every one of its programs (its single-row loop on sm_90
under h200.json: 3.72 instead of 8.03 instructions per FP8 weight, `python -m benchmarks.kernel_report --kernel
skinny`). Each program's tile interleaves gate and up rows, column c's gate beside its up.

Each program loads its first weight tile before anything that depends on the previous kernel (x, the
norm's first pass, the residual): the weights are constant, so that load overlaps the norm's pass and,
under programmatic dependent launch (launch config `programmatic_dependent_launch`: launched with
launch_pdl, the dependent part after gdc_wait), the previous kernel's tail.

Measured on the H200 (docs/benchmarks.md), with the SwiGLU gate still in the down projection: a layer's four
projections for one row take 123.7 us fused on the CUDA cores with PDL (126.5 without, 134.7 before the first
tile moved ahead of the norm's pass) against 139 us unfused, and (a) runs at 231 tok/s against 209; for 8 or
16 rows the tensor-core variant is about 3x slower than cuBLAS, so h200.json fuses single rows only (max_rows 1).

FP8 weights (W [N, K] float8_e4m3fn with `weight_scale` [N], per output channel, fp8_quant.py): the tiles are
read as e4m3 (half the bytes), widened in registers, and each column's sum is multiplied by its scale after the
loop. On the CUDA cores, launch config `weight_vector` 8 loads them 8 to a thread, as x's bf16 columns are: left
to the compiler (0) they come 16 to a thread and every tile is rearranged through shared memory, with CTA-wide
barriers, to meet x's layout (sm_90, kernel_report). x' stays in x's dtype (W8A16: a batch this small is bound
by the weight reads, so quantizing the activations would save nothing and only lose precision); the launch
config's "float8_e4m3fn" entries (and "single_row_float8_e4m3fn") give such weights their own tiles and
max_rows.

With `residual`, the output goes into it in place: residual += y (y rounded to the output dtype first, as
the unfused ops round it). Each program reads and writes only its own columns, so no other program
sees a half-updated residual. The roundings are those of rms_norm, silu_and_mul and the residual add.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from llm_engine.kernels._validate import (
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_same_device,
    expect_shape,
)
from llm_engine.kernels.activation import silu_and_mul_ref
from llm_engine.kernels.launch_config import interpreting, launch_params
from llm_engine.kernels.rms_norm import rms_norm_ref

# x rows one program covers: tl.dot's smallest M. Larger batches go to cuBLAS and the unfused ops.
SKINNY_MAX_ROWS = 16
FP8 = torch.float8_e4m3fn
_PLAIN, _NORM, _GATED = 0, 1, 2


def fits_skinny_linear(x: torch.Tensor, weight_dtype: torch.dtype | None = None) -> bool:
    """Whether a step of x's rows takes the fused path on x's device, for weights of weight_dtype (default:
    x's) (launch config `max_rows`: 0 where cuBLAS and the separate small kernels are faster at every batch)."""
    max_rows = _params(x, weight_dtype or x.dtype, single_row=False)["max_rows"]
    return 0 < x.shape[0] <= min(max_rows, SKINNY_MAX_ROWS)


def _params(x: torch.Tensor, weight_dtype: torch.dtype, single_row: bool) -> dict:
    """The launch parameters: "default", x's dtype, then for FP8 weights "float8_e4m3fn"; for the
    single-row variant "single_row", then "single_row_float8_e4m3fn"."""
    fp8 = weight_dtype == FP8
    entries = [x.dtype] + (["float8_e4m3fn"] if fp8 else [])
    if single_row:
        entries += ["single_row"] + (["single_row_float8_e4m3fn"] if fp8 else [])
    return launch_params("skinny_linear", x.device, *entries)


def skinny_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K]), M <= 16, weight [N, K], bias [N] -> x' W^T + b as [M, N], or added into
    residual [M, N] in place (and residual returned), or with swiglu silu(y[:, :N/2]) * y[:, N/2:] as
    [M, N/2]. x' is x, rmsnorm(x) * norm_weight (norm_weight given) or silu(gate) * up (gated). FP8 weights
    (float8_e4m3fn with float32 weight_scale [N]) are dequantized and multiplied in float32, x' in x's dtype."""
    _check_args(x, weight, bias, norm_weight, gated, residual, weight_scale, swiglu)
    if norm_weight is not None:
        x = rms_norm_ref(x, norm_weight, eps)
    elif gated:
        x = silu_and_mul_ref(x)
    if weight_scale is not None:
        y = F.linear(x.float(), weight.float() * weight_scale[:, None], None if bias is None else bias.float())
        y = y.to(x.dtype)
    else:
        y = F.linear(x, weight, bias)
    if swiglu:
        return silu_and_mul_ref(y)
    if residual is None:
        return y
    return residual.copy_((residual.float() + y.float()).to(residual.dtype))


# The row count changes with the batch: not specialised on, so one variant per weight shape and mode.
@triton.jit(do_not_specialize=["M"])
def _skinny_linear_kernel(
    x_ptr, w_ptr, w_scale_ptr, b_ptr, norm_w_ptr, out_ptr,
    M, N, K, stride_xm, stride_wn, stride_om, eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PROLOGUE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ADD_TO_OUT: tl.constexpr,
    USE_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PDL: tl.constexpr,
    W_FP8: tl.constexpr,
    SWIGLU: tl.constexpr,
    WEIGHT_VECTOR: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M
    if SWIGLU:  # N: the output's width; tile column 2c is gate row c, 2c + 1 its up row N + c
        tile = tl.arange(0, BLOCK_N)
        out_cols = tl.program_id(0) * (BLOCK_N // 2) + tile // 2
        cols = out_cols + (tile % 2) * N
        col_mask = out_cols < N
    else:
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_mask = cols < N
    x_rows = x_ptr + rows[:, None] * stride_xm
    # The weights do not depend on the kernel before: under programmatic dependent launch the first
    # tile is on its way while that kernel finishes, and only x, the residual and the output wait for it.
    w = _weight_tile(w_ptr, cols, col_mask, tl.arange(0, BLOCK_K), K, stride_wn, EVEN_K, WEIGHT_VECTOR)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    if PROLOGUE == 1:  # norm: each row's mean square over all of K first, summed across threads once
        squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
        for k_start in range(0, K, BLOCK_K):
            ks = k_start + tl.arange(0, BLOCK_K)
            xs = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
            squares += xs * xs
        rstd = tl.math.rsqrt(tl.sum(squares, axis=1) / K + eps)
    else:
        rstd = tl.full([BLOCK_M], 1.0, dtype=tl.float32)  # unused
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:  # summed along K only after the loop: no cross-thread reduction or layout conversion per tile
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc = _accumulate(acc, w, x_rows, row_mask, tl.arange(0, BLOCK_K), K, rstd, norm_w_ptr,
                      EVEN_K, PROLOGUE, USE_DOT, DOT_PRECISION, UPCAST_DOT)
    for k_start in range(BLOCK_K, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        w = _weight_tile(w_ptr, cols, col_mask, ks, K, stride_wn, EVEN_K, WEIGHT_VECTOR)
        acc = _accumulate(acc, w, x_rows, row_mask, ks, K, rstd, norm_w_ptr,
                          EVEN_K, PROLOGUE, USE_DOT, DOT_PRECISION, UPCAST_DOT)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)[None, :]
    if W_FP8:  # each output channel's scale, once per column after the sums
        acc *= tl.load(w_scale_ptr + cols, mask=col_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if SWIGLU:  # gate and up rounded to the output dtype first, as the unfused projection rounds them
        gate, up = tl.split(tl.reshape(acc.to(out_ptr.dtype.element_ty).to(tl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
        acc = gate * tl.sigmoid(gate) * up
        cols = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        col_mask = cols < N
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    out_mask = row_mask[:, None] & col_mask[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if ADD_TO_OUT:
        y = (y.to(tl.float32) + tl.load(out_ptrs, mask=out_mask, other=0.0).to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptrs, y, mask=out_mask)


@triton.jit
def _weight_tile(w_ptr, cols, col_mask, ks, K, stride_wn, EVEN_K: tl.constexpr, WEIGHT_VECTOR: tl.constexpr):
    """Weight rows `cols` at columns ks: [BLOCK_N, BLOCK_K] (no mask along K when K is whole tiles: full-width
    vector loads). WEIGHT_VECTOR > 0: loaded in vectors of that many weights per thread (else 16 bytes)."""
    mask = col_mask[:, None] if EVEN_K else col_mask[:, None] & (ks < K)[None, :]
    pointers = w_ptr + cols[:, None] * stride_wn + ks[None, :]
    if WEIGHT_VECTOR > 0:
        pointers = tl.max_contiguous(pointers, [1, WEIGHT_VECTOR])
    return tl.load(pointers, mask=mask, other=0.0)


@triton.jit
def _accumulate(acc, w, x_rows, row_mask, ks, K, rstd, norm_w_ptr, EVEN_K: tl.constexpr, PROLOGUE: tl.constexpr,
                USE_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """acc + x' w^T for one K tile, x' computed from x's columns ks on the way (in x's dtype; FP8
    weights are widened to it)."""
    x_mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (ks < K)[None, :]
    x_dtype = x_rows.dtype.element_ty
    if PROLOGUE == 2:  # gated: x holds [gate | up], K wide each
        gate = tl.load(x_rows + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        up = tl.load(x_rows + K + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        x = (gate * tl.sigmoid(gate) * up).to(x_dtype)
    else:
        x = tl.load(x_rows + ks[None, :], mask=x_mask, other=0.0)
        if PROLOGUE == 1:
            norm_w = tl.load(norm_w_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) * rstd[:, None] * norm_w[None, :]).to(x_dtype)
    if USE_DOT and w.dtype != x_dtype:  # e4m3 weights: exact in any wider dtype
        w = w.to(x_dtype)
    if USE_DOT:
        # The interpreter's tl.dot multiplies bf16's raw uint16 storage; float32 dots sidestep it.
        if UPCAST_DOT:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
    else:  # products on the CUDA cores: no 16-row padding, no shared-memory operands
        acc += w.to(tl.float32) * tl.sum(x.to(tl.float32), axis=0)[None, :]  # x: the one row
    return acc


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    gated: bool = False,
    residual: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """x [M, K] (gated: [M, 2K]), M <= 16, weight [N, K], bias [N] -> x' W^T + b as [M, N], or added into
    residual [M, N] in place (and residual returned), or with swiglu silu(y[:, :N/2]) * y[:, N/2:] as
    [M, N/2]. x' is x, rmsnorm(x) * norm_weight (norm_weight given) or silu(gate) * up (gated). FP8
    weights: float8_e4m3fn with float32 weight_scale [N]. One launch."""
    _check_args(x, weight, bias, norm_weight, gated, residual, weight_scale, swiglu)
    expect_launchable("x", x, "skinny_linear_ref")
    num_rows, (n, k) = x.shape[0], weight.shape
    n_out = n // 2 if swiglu else n
    out = torch.empty((num_rows, n_out), dtype=x.dtype, device=x.device) if residual is None else residual
    if num_rows == 0 or n == 0:
        return out
    params = _params(x, weight.dtype, single_row=False)
    use_dot = not (num_rows == 1 and params["single_row_on_cuda_cores"])
    if not use_dot:  # the single-row variant's own tiles (no 16-column minimum)
        params = _params(x, weight.dtype, single_row=True)
    pdl = params["programmatic_dependent_launch"] and not interpreting()
    block_n, block_k = params["BLOCK_N"], min(params["BLOCK_K"], max(16, triton.next_power_of_2(k)))
    w_fp8 = weight.dtype == FP8
    _skinny_linear_kernel[(triton.cdiv(n_out, block_n // 2 if swiglu else block_n),)](
        x, weight, weight_scale if w_fp8 else x, x if bias is None else bias, x if norm_weight is None else norm_weight,
        out,
        num_rows, n_out, k, x.stride(0), weight.stride(0), out.stride(0), eps,
        BLOCK_M=SKINNY_MAX_ROWS if use_dot else 1,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        EVEN_K=k % block_k == 0,
        PROLOGUE=_NORM if norm_weight is not None else _GATED if gated else _PLAIN,
        HAS_BIAS=bias is not None,
        ADD_TO_OUT=residual is not None,
        USE_DOT=use_dot,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST_DOT=interpreting() and x.dtype == torch.bfloat16,
        PDL=pdl,
        W_FP8=w_fp8,
        SWIGLU=swiglu,
        WEIGHT_VECTOR=params["weight_vector"],
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
        **({"launch_pdl": True} if pdl else {}),
    )
    return out


def _check_args(x, weight, bias, norm_weight, gated, residual, weight_scale=None, swiglu=False) -> None:
    expect_ndim("x", x, 2, "[rows, in_features]" + (" x 2 (gate | up)" if gated else ""))
    expect_ndim("weight", weight, 2, "[out_features, in_features]")
    if x.shape[0] > SKINNY_MAX_ROWS:
        raise ValueError(f"x has {x.shape[0]} rows; skinny_linear takes at most {SKINNY_MAX_ROWS}")
    if norm_weight is not None and gated:
        raise ValueError("skinny_linear takes norm_weight or gated, not both")
    if swiglu and residual is not None:
        raise ValueError("swiglu's output is the gated activation, half as wide: it cannot go into a residual")
    if swiglu and weight.shape[0] % 2:
        raise ValueError(f"swiglu needs weight = [gate; up], an even number of rows, got {weight.shape[0]}")
    in_features = weight.shape[1] * (2 if gated else 1)
    if x.shape[1] != in_features:
        raise ValueError(f"x has {x.shape[1]} features but weight takes {weight.shape[1]}"
                         + (" (gated: x must be [gate | up], twice that)" if gated else ""))
    if weight.dtype == FP8:
        if weight_scale is None:
            raise ValueError("FP8 weights (float8_e4m3fn) need their weight_scale [out_features]")
        expect_shape("weight_scale", weight_scale, (weight.shape[0],))
        if weight_scale.dtype != torch.float32 or not weight_scale.is_contiguous():
            raise ValueError(f"weight_scale must be contiguous float32, got {weight_scale.dtype}")
    elif weight_scale is not None:
        raise ValueError(f"weight_scale is for float8_e4m3fn weights, not {weight.dtype}")
    for name, tensor in (("weight", weight), ("bias", bias), ("norm_weight", norm_weight), ("residual", residual)):
        if tensor is not None and tensor.dtype != x.dtype and not (name == "weight" and tensor.dtype == FP8):
            raise ValueError(f"{name} must have x's dtype {x.dtype}, got {tensor.dtype}")
    expect_last_dim_contiguous("x", x)
    expect_last_dim_contiguous("weight", weight)
    for name, tensor, size in (("bias", bias, weight.shape[0]), ("norm_weight", norm_weight, weight.shape[1])):
        if tensor is not None:
            expect_shape(name, tensor, (size,))
            if not tensor.is_contiguous():
                raise ValueError(f"{name} must be contiguous, got stride {tensor.stride()}")
    if residual is not None:
        expect_shape("residual", residual, (x.shape[0], weight.shape[0]))
        expect_last_dim_contiguous("residual", residual)
        # Every program reads all of x (and the norm's pass reads it twice): x must not change under it.
        if residual.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError("residual must not share memory with x: the output would overwrite the input")
    expect_same_device(x=x, weight=weight, bias=bias, norm_weight=norm_weight, residual=residual,
                       weight_scale=weight_scale)
