"""W8A8 FP8 GEMM: out = (a @ b^T) * a_scale[:, None] * b_scale[None, :] (+ bias), and the FP8 linear layer.

a [M, K] e4m3 (activations quantized per token, fp8_quant.py), b [N, K] e4m3 (a weight quantized per
output channel: the nn.Linear layout, K contiguous, which is what the tensor cores' FP8 operands want),
float32 scales, a bf16/fp16/fp32 output. The Triton kernel runs tl.dot on the e4m3 tiles (the FP8 tensor
cores on Hopper), accumulates in float32 and applies both scales and the bias in the epilogue. On Hopper
the FP8 tensor cores keep fewer bits while they add (cuBLAS's "fast accumulation"); launch config
`max_num_imprecise_acc` (null: Triton's default, which never promotes there) moves the sum into float32
every that many of K, as `fast_accum` false does for torch._scaled_mm.

How close to fp8_gemm_ref a correct result is, per element, is fp8_gemm_error_bound's error model (the
tests' and the benchmark's tolerance): float32 sums in any order, Hopper's fast accumulation where it
applies, the epilogue's and the output's roundings.

`fp8_linear` is what a quantized projection calls: quantize x per token (or with a static input
scale), then `fp8_matmul` (also called alone on activations a fused kernel quantized): the GEMM by the
backend that the launch config's row bucket names ("m<=R" entries of `fp8_gemm`,
launch_config.launch_params_for_rows): "triton" (this kernel, with that bucket's tiles)
or "scaled_mm" (torch._scaled_mm, cuBLASLt, row-wise scales; where it cannot run the shape, Triton).
Which is faster per batch size is measured on each GPU (benchmarks/bench_kernels.py --cases fp8_gemm
--sweep prints the buckets to write). Small decode batches go through skinny_linear instead, its
weights upcast in registers (the model's choice, llama.py), never through here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm_engine.kernels._validate import (
    expect_dtype,
    expect_last_dim_contiguous,
    expect_launchable,
    expect_ndim,
    expect_same_device,
    expect_shape,
)
from llm_engine.kernels.fp8_quant import (
    ACTIVATION_DTYPES,
    FP8,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
)
from llm_engine.kernels.launch_config import interpreting, launch_params_for_rows

BACKENDS = ("triton", "scaled_mm")
# Hopper's FP8 tensor cores (wgmma ... e4m3, which tl.dot on e4m3 tiles of 64 rows or more compiles to, and
# cuBLAS's fast accumulation) add each instruction's 32 products along K into an accumulator that keeps 13
# mantissa bits ("FP22": SageAttention2, Zhang et al. 2024; DeepSeek-V3's report: "around 14 bits"), truncating.
# Tiles of fewer rows run mma.sync on the e4m3 values converted to fp16 (exactly: every e4m3 value is an fp16
# value) with float32 sums; the interpreter multiplies in float32.
FAST_ACCUM_GROUP = 32
FAST_ACCUM_ULP = 2.0 ** -13  # one truncation to 14 significant bits loses less than this much of the value
# Unit roundoff of an output dtype: a correctly rounded result is within this much of its value.
_UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def fp8_gemm_ref(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """a [M, K] e4m3, a_scale [M], b [N, K] e4m3, b_scale [N] (float32), bias [N] -> [M, N] out_dtype:
    the dequantized operands multiplied in float32."""
    _check_gemm_args(a, a_scale, b, b_scale, bias, out_dtype)
    out = (a.float() * a_scale[:, None]) @ (b.float() * b_scale[:, None]).T
    if bias is not None:
        out += bias.float()
    return out.to(out_dtype)


def fp8_gemm_error_bound(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    fast_accum: bool = False,
    promote_every: int | None = None,
    k_in_order: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result of fp8_gemm_ref's product (float64 [M, N], bias added) and how far a correct GEMM's
    result in out_dtype may be from it, per element (float32 [M, N]), from this error model (the e4m3
    products are exact everywhere; S = sum_k |a_k b_k|, P_i the running sum after the i-th group of
    FAST_ACCUM_GROUP products along K):

    - float32 sums: each addition into the accumulator rounds (or truncates) within 2^-23 of the running
      sum, so 2^-23 (sum_i |P_i| + 256 S), the 256 S for products summed in an unknown order within a tile
      (the interpreter's tl.dot over BLOCK_K <= 256);
    - with `fast_accum` (Hopper's FP8 tensor cores, FAST_ACCUM_GROUP): each addition of a group's 32
      products truncates the accumulator to 14 significant bits: 2^-13 (S + sum_i |P_i|), the S term for
      what the instruction loses aligning its products. `promote_every` (Triton's max_num_imprecise_acc,
      cuBLAS without fast accumulation): the running sum restarts every that many of K and its results
      are added in float32;
    - `k_in_order` False (cuBLAS, which may split K into slices summed apart): a slice's running sums are
      within max_i |P_i| of the whole pass's, which adds (K / 32) max_i |P_i| to each sum over i;
    - the epilogue (both scales, the bias): a few float32 roundings;
    - the output dtype: the kernel's result within one ulp (the interpreter truncates to bf16), and
      torch._scaled_mm's rounding before its bias is added in that dtype.

    The fast accumulation's error grows with K (about K / 32 truncations), while a result may be near zero
    whatever its terms: the bound is absolute, per element, from the sums' magnitudes. Computed in float64,
    in slices of rows."""
    _check_gemm_args(a, a_scale, b, b_scale, bias, out_dtype)
    (m, k), n = a.shape, b.shape[0]
    groups = triton.cdiv(max(k, 1), FAST_ACCUM_GROUP)
    pad = groups * FAST_ACCUM_GROUP - k
    interval = groups if promote_every is None else max(1, promote_every // FAST_ACCUM_GROUP)
    b_groups = torch.nn.functional.pad(b.double(), (0, pad)).view(n, groups, FAST_ACCUM_GROUP).permute(1, 2, 0)
    b_abs = b_groups.abs()
    bias64 = torch.zeros(n, dtype=torch.float64, device=a.device) if bias is None else bias.double()
    u_out = _UNIT_ROUNDOFF[out_dtype]
    exact = torch.empty((m, n), dtype=torch.float64, device=a.device)
    bound = torch.empty((m, n), dtype=torch.float32, device=a.device)
    steps = torch.arange(groups, device=a.device)

    def running_sums(sums, restart_every):
        """|P_i| summed over i (+ the slices' term), the running sums restarting every restart_every groups."""
        running = sums.cumsum(0)
        if restart_every < groups:
            before = torch.cat([torch.zeros_like(running[:1]), running[:-1]])
            running = running - before[steps // restart_every * restart_every]
        running = running.abs()
        total = running.sum(0)
        return total if k_in_order else total + groups * running.amax(0)

    rows = max(1, (1 << 24) // max(1, n * groups))
    for start in range(0, m, rows):
        a_groups = torch.nn.functional.pad(a[start:start + rows].double(), (0, pad))
        a_groups = a_groups.view(-1, groups, FAST_ACCUM_GROUP).transpose(0, 1)
        sums = torch.bmm(a_groups, b_groups)  # [groups, rows, N]: each group's sum of products, exact
        abs_sum = torch.bmm(a_groups.abs(), b_abs).sum(0)
        err = 2.0 ** -23 * (running_sums(sums, groups) + 256 * abs_sum)
        if fast_accum:
            err += FAST_ACCUM_ULP * (abs_sum + running_sums(sums, interval))
        scale = a_scale[start:start + rows].double()[:, None] * b_scale.double()[None, :]
        product = sums.sum(0) * scale
        exact[start:start + rows] = product + bias64
        err = err * scale + 2.0 ** -21 * (abs_sum * scale + bias64.abs())
        err += u_out * (2 * (exact[start:start + rows].abs() + err) + product.abs())
        bound[start:start + rows] = err.float()
    return exact, bound


def accumulation_model(device: torch.device, params: dict) -> dict:
    """fp8_gemm_error_bound's keyword arguments for the GEMM that fp8_linear runs on `device` with the launch
    `params` of its row bucket (where torch._scaled_mm cannot take the product, pass the params with backend
    "triton"): float32 sums on the CPU and in the interpreter; torch._scaled_mm's fast accumulation (without
    it cuBLAS promotes partial sums, which the same bound covers), K possibly split; the Triton kernel's FP8
    tensor cores, promoted every max_num_imprecise_acc of K when set, except on Hopper for tiles of fewer
    than 64 rows, which Triton runs as fp16 mma.sync with float32 sums (cvt e4m3 -> f16, exact)."""
    if device.type != "cuda" or interpreting():
        return {}
    if params["backend"] == "scaled_mm":
        return {"fast_accum": True, "k_in_order": False}
    if params["BLOCK_M"] < 64 and torch.cuda.get_device_capability(device) == (9, 0):
        return {}
    return {"fast_accum": True, "promote_every": params.get("max_num_imprecise_acc")}


# The row count changes with the batch: not specialised on, so one variant per weight shape and tile.
@triton.jit(do_not_specialize=["M"])
def _fp8_gemm_kernel(
    a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr,
    M, N, K, stride_am, stride_bn, stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    MAX_IMPRECISE_ACC: tl.constexpr,
):
    # Programs in groups of GROUP_M row tiles sweep the column tiles together, so a group's b tiles
    # are read from HBM once and from L2 by the rest.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows and columns past the end load (in bounds) copies of others instead of masking every load;
    # only the store is masked.
    rows_in = rows % M
    cols_in = cols % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows_in.to(tl.int64)[:, None] * stride_am + ks[None, :]
    b_ptrs = b_ptr + cols_in.to(tl.int64)[None, :] * stride_bn + ks[:, None]  # [BLOCK_K, BLOCK_N], K-major
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k_start + ks)[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=(k_start + ks)[:, None] < K, other=0.0)
        if UPCAST_DOT:  # the interpreter: float32 products of the e4m3 values (exact)
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        else:  # Hopper's FP8 tensor cores add with fewer bits unless promoted every MAX_IMPRECISE_ACC of K
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=MAX_IMPRECISE_ACC)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    a_scale = tl.load(a_scale_ptr + rows_in)
    b_scale = tl.load(b_scale_ptr + cols_in)
    acc = acc * a_scale[:, None] * b_scale[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols_in).to(tl.float32)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & (cols < N)[None, :])


def fp8_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    params: dict | None = None,
) -> torch.Tensor:
    """a [M, K] e4m3, a_scale [M], b [N, K] e4m3, b_scale [N] (float32), bias [N] -> [M, N] out_dtype,
    by the Triton kernel with `params` (default: the launch config's bucket of M rows). One launch."""
    _check_gemm_args(a, a_scale, b, b_scale, bias, out_dtype)
    expect_launchable("a", a, "fp8_gemm_ref")
    (m, k), n = a.shape, b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.copy_(bias.expand(m, n)) if bias is not None else out.zero_()
    params = params or launch_params_for_rows("fp8_gemm", a.device, m)
    block_m, block_n, block_k = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_gemm_kernel[grid](
        a, b, a_scale, b_scale, b_scale if bias is None else bias, out,
        m, n, k, a.stride(0), b.stride(0), out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=params["GROUP_M"],
        EVEN_K=k % block_k == 0,
        HAS_BIAS=bias is not None,
        UPCAST_DOT=interpreting(),
        MAX_IMPRECISE_ACC=params.get("max_num_imprecise_acc"),
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
    )
    return out


def fp8_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32), weight [N, K] e4m3 with float32 weight_scale [N], bias [N] in x's dtype
    -> [M, N] in x's dtype: x quantized to e4m3 per token (or by the static input_scale), both operands
    dequantized, multiplied in float32."""
    _check_linear_args(x, weight, weight_scale, bias, input_scale)
    values, scale = quantize_fp8_per_token_ref(x, input_scale)
    return fp8_gemm_ref(values, scale, weight, weight_scale, bias, x.dtype)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp8_linear_ref's result: the per-token quantization kernel, then fp8_matmul (two launches; a bias
    after torch._scaled_mm, a third)."""
    _check_linear_args(x, weight, weight_scale, bias, input_scale)
    expect_launchable("x", x, "fp8_linear_ref")
    values, scale = quantize_fp8_per_token(x, input_scale)
    return fp8_matmul(values, scale, weight, weight_scale, bias, x.dtype)


def fp8_matmul(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """fp8_gemm_ref's result on activations already quantized (fp8_linear's, or a fused kernel's): the
    GEMM by the backend of the launch config's row bucket for a's rows (fp8_gemm checks its own arguments)."""
    params = launch_params_for_rows("fp8_gemm", a.device, a.shape[0])
    if params["backend"] == "scaled_mm" and scaled_mm_fits(a, b, out_dtype):
        _check_gemm_args(a, a_scale, b, b_scale, bias, out_dtype)
        out = torch._scaled_mm(a, b.t(), scale_a=a_scale[:, None], scale_b=b_scale[None, :],
                               out_dtype=out_dtype, use_fast_accum=params.get("fast_accum", True))
        return out if bias is None else out.add_(bias)
    if params["backend"] not in BACKENDS:
        raise ValueError(f"fp8_gemm launch config backend {params['backend']!r}: expected one of {BACKENDS}")
    return fp8_gemm(a, a_scale, b, b_scale, bias, out_dtype, params)


fp8_matmul_ref = fp8_gemm_ref  # fp8_matmul only chooses the backend: its reference is the GEMM's


def scaled_mm_fits(a: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether torch._scaled_mm with row-wise scales takes this product of a [M, K] (CUDA) and weight [N, K]:
    a bf16 output, K and N multiples of 16, at least one row."""
    n, k = weight.shape
    return a.is_cuda and out_dtype == torch.bfloat16 and k % 16 == 0 and n % 16 == 0 and a.shape[0] > 0


def warm_up_fp8_linear(layers: list[tuple[torch.Tensor, torch.Tensor | None]], dtype: torch.dtype,
                       max_rows: int) -> int:
    """Compile every Triton variant fp8_linear can launch for these layers ((e4m3 weight [N, K], static
    input scale or None) each) on x of `dtype` at up to max_rows rows: one call at every power of two
    up to max_rows (the row buckets' bounds), so no step compiles one while serving. -> the calls made."""
    calls = 0
    distinct = {(tuple(w.shape), s is None): (w, s) for w, s in layers}
    bounds = sorted({min(max_rows, 1 << e) for e in range(max_rows.bit_length() + 1)})
    for weight, input_scale in distinct.values():
        n, k = weight.shape
        scale = torch.ones(n, dtype=torch.float32, device=weight.device)
        for rows in bounds:
            fp8_linear(torch.ones(rows, k, dtype=dtype, device=weight.device), weight, scale, None, input_scale)
            calls += 1
    return calls


def _check_gemm_args(a, a_scale, b, b_scale, bias, out_dtype) -> None:
    expect_ndim("a", a, 2, "[rows, in_features]")
    expect_ndim("b", b, 2, "[out_features, in_features]")
    expect_dtype("a", a, (FP8,))
    expect_dtype("b", b, (FP8,))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"a has {a.shape[1]} features but b takes {b.shape[1]}")
    expect_shape("a_scale", a_scale, (a.shape[0],))
    expect_shape("b_scale", b_scale, (b.shape[0],))
    expect_dtype("a_scale", a_scale, (torch.float32,))
    expect_dtype("b_scale", b_scale, (torch.float32,))
    if out_dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"out_dtype must be one of {ACTIVATION_DTYPES}, got {out_dtype}")
    if bias is not None:
        expect_shape("bias", bias, (b.shape[0],))
        if not bias.is_contiguous():
            raise ValueError(f"bias must be contiguous, got stride {bias.stride()}")
    expect_last_dim_contiguous("a", a)
    expect_last_dim_contiguous("b", b)
    for name, scale in (("a_scale", a_scale), ("b_scale", b_scale)):
        if not scale.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got stride {scale.stride()}")
    expect_same_device(a=a, a_scale=a_scale, b=b, b_scale=b_scale, bias=bias)


def _check_linear_args(x, weight, weight_scale, bias, input_scale) -> None:
    expect_ndim("x", x, 2, "[rows, in_features]")
    expect_dtype("x", x, ACTIVATION_DTYPES)
    expect_ndim("weight", weight, 2, "[out_features, in_features]")
    expect_dtype("weight", weight, (FP8,))
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features but weight takes {weight.shape[1]}")
    expect_shape("weight_scale", weight_scale, (weight.shape[0],))
    expect_dtype("weight_scale", weight_scale, (torch.float32,))
    if bias is not None and bias.dtype != x.dtype:
        raise ValueError(f"bias must have x's dtype {x.dtype}, got {bias.dtype}")
    expect_same_device(x=x, weight=weight, weight_scale=weight_scale, bias=bias, input_scale=input_scale)
