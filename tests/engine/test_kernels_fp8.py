"""FP8 weights (W8A8): the per-token activation quantizer (also fused after the SwiGLU gate and RMSNorm), the FP8 GEMM,
fp8_linear's and fp8_matmul's dispatch and the fused
small-batch projections with e4m3 weights, each against its torch reference, which dequantizes to float32 and
multiplies there (CPU torch has no float8 matmul); and quantize-dequantize round trips, exact where e4m3 is."""
from __future__ import annotations

import pytest
import torch
from tiers import FLOAT32_IN_FULL_RUN, in_full_run

from llm_engine.kernels import (
    SKINNY_MAX_ROWS,
    dequantize_fp8_weight_ref,
    fits_skinny_linear,
    fp8_gemm,
    fp8_gemm_error_bound,
    fp8_gemm_ref,
    fp8_linear,
    fp8_linear_ref,
    fp8_matmul,
    quantize_fp8_per_token,
    quantize_fp8_per_token_ref,
    quantize_fp8_weight_ref,
    rms_norm,
    rms_norm_quantize_fp8,
    rms_norm_quantize_fp8_ref,
    silu_and_mul,
    silu_and_mul_quantize_fp8,
    silu_and_mul_quantize_fp8_ref,
    skinny_linear,
    skinny_linear_ref,
)
from llm_engine.kernels.fp8_gemm import accumulation_model, scaled_mm_fits
from llm_engine.kernels.kv_store import FP8_E4M3_INV_MAX
from llm_engine.model.fp8_checkpoint import quantize_weight
from llm_engine.kernels.launch_config import launch_params_for_rows, override_launch_params

FP8 = torch.float8_e4m3fn
# Small tiles: several programs along M, N and K, partial tiles at every edge, row groups of 2.
SMALL_TILES = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=2)


def assert_within_error_model(out, a, a_scale, b, b_scale, bias=None, params=None):
    """out (a GEMM of these quantized operands, in its dtype) against their exact product, per element within
    fp8_gemm_error_bound: float32 sums, and the FP8 tensor cores' fast accumulation where the launch `params`
    run on them (accumulation_model; None: float32 sums in any order, as fp8_gemm_ref's torch matmul).
    The bound is absolute per element, from the sums' magnitudes, and grows with K where accumulation is fast:
    neither an atol nor an rtol for all shapes (an element near zero has a large relative error)."""
    model = accumulation_model(out.device, params) if params is not None else {"k_in_order": False}
    exact, bound = fp8_gemm_error_bound(a, a_scale, b, b_scale, bias, out.dtype, **model)
    error = (out.double() - exact).abs()
    beyond = error > bound
    if beyond.any():
        worst = int((error / bound).argmax())
        row, col = divmod(worst, out.shape[1])
        raise AssertionError(f"{int(beyond.sum())} of {out.numel()} elements beyond the error bound ({model}); worst "
                             f"({row}, {col}): {out[row, col].item()} vs exact {exact[row, col].item()}, |error| "
                             f"{error[row, col].item():.3g} > {bound[row, col].item():.3g}")


def linear_params(x, weight):
    """The launch params of the GEMM fp8_linear runs for x: its row bucket's, backend triton where
    torch._scaled_mm cannot take the product."""
    params = launch_params_for_rows("fp8_gemm", x.device, x.shape[0])
    fits = params["backend"] == "triton" or scaled_mm_fits(x, weight, x.dtype)
    return params if fits else {**params, "backend": "triton"}


def randn(gen, *shape, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)


def e4m3_grid(gen, rows, cols, device):
    """Random e4m3-representable values with a +-448 in every row (so amax / 448 is a power of two's
    exact scale) and zeros, subnormals and normals in between."""
    values = randn(gen, rows, cols, scale=60.0).clamp(-448, 448).to(FP8).float()
    values[:, 0] = torch.where(torch.rand(rows, generator=gen) < 0.5, -448.0, 448.0)
    values[:, 1] = 2.0 ** -9  # the smallest subnormal
    values[:, 2] = 0.0
    return values.to(device)


def same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# --- quantizers --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("rows, cols", [(1, 16), (3, 100), (7, 333)])
@pytest.mark.parametrize("block_k", [64, 4096])  # several tiles per row, one tile
def test_per_token_quantization_matches_ref_bit_for_bit(gen, device, dtype, rows, cols, block_k):
    x = randn(gen, rows, cols, dtype=dtype, device=device, scale=3.0)
    x[0, :5] = 0.0
    if rows > 2:
        x[2] = 0.0  # an all-zero row: the floor scale, zeros
    expected_values, expected_scale = quantize_fp8_per_token_ref(x)
    with override_launch_params("quantize_fp8_per_token", BLOCK_K=block_k):
        values, scale = quantize_fp8_per_token(x)
    assert values.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (rows,)
    assert same_bytes(values, expected_values)
    assert torch.equal(scale, expected_scale)


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("rows, width", [(1, 16), (3, 100), (5, 333)])
@pytest.mark.parametrize("block_k", [64, 4096])  # several tiles per row, one tile
def test_gated_quantization_is_the_gate_then_the_quantizer_bit_for_bit(gen, device, dtype, rows, width, block_k):
    """silu_and_mul_quantize_fp8 gives the bytes and scales of silu_and_mul's output quantized per token (the
    two kernels it replaces in the MLP), and stays within an e4m3 step of the torch reference's values."""
    x = randn(gen, rows, 2 * width, dtype=dtype, device=device, scale=3.0)
    if rows > 2:
        x[2, :width] = 0.0  # a gate of zeros: an all-zero row, the floor scale
    expected_values, expected_scale = quantize_fp8_per_token(silu_and_mul(x))
    with override_launch_params("silu_and_mul_quantize_fp8", BLOCK_K=block_k):
        values, scale = silu_and_mul_quantize_fp8(x)
    assert values.dtype == FP8 and values.shape == (rows, width) and scale.shape == (rows,)
    assert same_bytes(values, expected_values) and torch.equal(scale, expected_scale)
    ref_values, ref_scale = silu_and_mul_quantize_fp8_ref(x)
    torch.testing.assert_close(scale, ref_scale, rtol=2.0 ** -7, atol=0)  # amax, as the gate's dtype rounds it
    got, want = values.float() * scale[:, None], ref_values.float() * ref_scale[:, None]
    assert ((got - want).abs() <= want.abs() * 2.0 ** -3 + ref_scale[:, None] * 2.0 ** -9).all()


# On sm_90 the quantizing variant adds a row of 4096 up in another layout than rms_norm (16 values a thread, not
# 8): with float32 sums about 1 row in 1000 came out a byte apart, so the GPU checks 8192 rows.
NORM_SHAPES = [(1, 16), (4, 100), (3, 333)] + ([(8192, 4096)] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden", NORM_SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_normed_quantization_is_the_norm_then_the_quantizer_bit_for_bit(gen, device, dtype, rows, hidden,
                                                                         with_residual):
    """rms_norm_quantize_fp8 gives the bytes and scales of rms_norm's output quantized per token, and updates the
    residual as rms_norm does; its reference is the two references'."""
    x = randn(gen, rows, hidden, dtype=dtype, device=device, scale=2.0)
    weight = randn(gen, hidden, dtype=dtype, device=device)
    residual = randn(gen, rows, hidden, dtype=dtype, device=device) if with_residual else None
    copies = [None if residual is None else residual.clone() for _ in range(3)]
    normed = rms_norm(x, weight, 1e-5, copies[0])
    expected_values, expected_scale = quantize_fp8_per_token(normed if residual is None else normed[0])
    values, scale = rms_norm_quantize_fp8(x, weight, 1e-5, copies[1])
    assert values.dtype == FP8 and values.shape == (rows, hidden) and scale.shape == (rows,)
    assert same_bytes(values, expected_values) and torch.equal(scale, expected_scale)
    if residual is not None:
        assert torch.equal(copies[1], copies[0])
    ref_values, ref_scale = rms_norm_quantize_fp8_ref(x, weight, 1e-5, copies[2])
    torch.testing.assert_close(scale, ref_scale, rtol=2.0 ** -6, atol=0)  # the norms' roundings: two bf16 ulps
    got, want = values.float() * scale[:, None], ref_values.float() * ref_scale[:, None]
    assert ((got - want).abs() <= want.abs() * 2.0 ** -3 + ref_scale[:, None] * 2.0 ** -9).all()


def test_gated_quantization_refuses_bad_input(device):
    with pytest.raises(ValueError, match="x's last dim must be even"):
        silu_and_mul_quantize_fp8(torch.zeros(2, 7, device=device))
    with pytest.raises(ValueError, match="x must have dtype in"):
        silu_and_mul_quantize_fp8(torch.zeros(2, 8, dtype=torch.int32, device=device))


def test_scales_are_one_float32_multiplication_on_every_device(gen, device):
    """scale = amax * float32(1 / 448) rounded once, by the kernel and the references alike, on any device
    (torch's own `amax / 448` is a division on the CPU and a multiplication by the float32 reciprocal on CUDA:
    an ulp apart in about half the rows). Row 0 is such a row (amax 3.875) and holds values exactly halfway
    between two e4m3 values of its grid (midpoints 336, 168, 84, 42 times 3.875 / 448, exact in bf16), which a
    scale an ulp off rounds a whole e4m3 step the other way: on the H200 (2026-12-04) the CUDA reference's
    scales were an ulp above the kernel's, and fp8_linear and bench_kernels' M=16 check failed on such rows."""
    ties = torch.tensor([2.90625, 1.453125, 0.7265625, 0.36328125])
    x = randn(gen, 4, 64, scale=2.0)
    x[0, :9] = torch.cat([torch.tensor([3.875]), ties, -ties])
    x = x.to(dtype=torch.bfloat16, device=device)
    amax = x.float().abs().amax(1).double()
    definition = (amax * FP8_E4M3_INV_MAX).float()  # the float64 product of two float32s is exact: one rounding
    divided = (amax / 448.0).float()  # amax / 448 correctly rounded
    assert definition[0] == divided[0].nextafter(torch.ones_like(divided[0]))  # an ulp apart in row 0
    results = {quantize.__name__: quantize(x) for quantize in (quantize_fp8_per_token_ref, quantize_fp8_per_token,
                                                              quantize_fp8_weight_ref)}
    for name, (values, scale) in results.items():
        assert torch.equal(scale, definition), name
        assert same_bytes(values, results["quantize_fp8_per_token_ref"][0]), name


def test_per_token_quantization_with_a_static_scale(gen, device):
    x = randn(gen, 5, 96, dtype=torch.bfloat16, device=device, scale=4.0)
    static = torch.tensor(0.02, device=device)  # small: large values saturate at +-448
    expected_values, expected_scale = quantize_fp8_per_token_ref(x, static)
    values, scale = quantize_fp8_per_token(x, static)
    assert same_bytes(values, expected_values) and torch.equal(scale, expected_scale)
    assert torch.equal(scale, torch.full((5,), 0.02, device=device))
    assert values.float().abs().max() == 448.0


@pytest.mark.parametrize("static", [None, 1.0, 0.5])
def test_every_e4m3_tie_and_signed_zero_rounds_as_the_cast(device, static):
    """Each midpoint between e4m3 neighbours (subnormal ones too), a float32 step either side of it, negatives,
    values that round to -0 (byte 0x80, as the cast gives), and past 448 under a static scale: the kernel's
    bytes are quantize_fp8_per_token_ref's."""
    codes = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()   # 0 .. 448
    mids = (codes[:-1] + codes[1:]) / 2
    near = [torch.nextafter(mids, torch.full_like(mids, 1e9)), torch.nextafter(mids, torch.zeros_like(mids))]
    zeros = torch.tensor([-0.0, 0.0, -2.0 ** -12, -2.0 ** -10, 2.0 ** -10, 449.0, 464.0, -1e6])
    rows = [torch.cat([torch.tensor([448.0]), part]) for part in (mids, -mids, *near, codes[1:], zeros)]
    x = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True).to(device)
    scale = None if static is None else torch.tensor(static, device=device)
    x = x if scale is None else x * static
    values, scales = quantize_fp8_per_token(x, scale)
    expected_values, expected_scales = quantize_fp8_per_token_ref(x, scale)
    assert same_bytes(values, expected_values) and torch.equal(scales, expected_scales)
    assert (values[-1, 1].view(torch.uint8) == 0x80).all()   # -0.0 stays -0


def test_round_trips_are_exact_where_e4m3_is(gen, device):
    """Rows of e4m3 values times a power of two (amax 448): weight and per-token quantizers give the
    values and the scale back exactly, and dequantization the input."""
    grid = e4m3_grid(gen, 6, 80, device)
    scales = 2.0 ** torch.arange(-8, -2, dtype=torch.float32, device=device)
    w = grid * scales[:, None]
    values, scale = quantize_fp8_weight_ref(w)
    assert torch.equal(scale, scales) and torch.equal(values.float(), grid)
    assert torch.equal(dequantize_fp8_weight_ref(values, scale), w)
    for quantize in (quantize_fp8_per_token_ref, quantize_fp8_per_token):
        values, scale = quantize(w.to(torch.bfloat16))  # powers of two times e4m3: exact in bf16 too
        assert torch.equal(scale, scales) and torch.equal(values.float(), grid), quantize.__name__


def test_a_per_tensor_scale_round_trips_exactly_where_e4m3_is(gen, device):
    """The checkpoint writer's per-tensor strategy: e4m3 values times one power of two (amax 448) come back."""
    grid = e4m3_grid(gen, 6, 80, device)
    values, scale = quantize_weight(grid * 2.0 ** -5, "tensor")
    assert torch.equal(scale, torch.tensor([2.0 ** -5], device=device)) and torch.equal(values.float(), grid)


def test_quantization_error_is_within_half_an_e4m3_step(gen, device):
    w = randn(gen, 32, 200, device=device) * torch.logspace(-3, 2, 32, device=device)[:, None]
    values, scale = quantize_fp8_weight_ref(w)
    error = (dequantize_fp8_weight_ref(values, scale) - w).abs()
    # e4m3: 3 mantissa bits, so half a step is 2^-4 of the value; subnormals step by 2^-9 of the scale.
    bound = torch.maximum(w.abs() * 2.0 ** -4, scale[:, None] * 2.0 ** -10)
    assert (error <= bound * (1 + 1e-6)).all()


# --- the GEMM and fp8_linear -------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n, k", [(1, 16, 32), (5, 40, 96), (3, 1, 7), (17, 13, 33),   # ragged M, N, K tiles,
                                     *in_full_run((33, 100, 200))])                         # odd K, one column
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_gemm_matches_ref(gen, device, out_dtype, m, n, k, with_bias):
    a, a_scale = quantize_fp8_per_token_ref(randn(gen, m, k, device=device))
    b, b_scale = quantize_fp8_weight_ref(randn(gen, n, k, device=device) / k**0.5)
    bias = randn(gen, n, dtype=out_dtype, device=device) if with_bias else None
    with override_launch_params("fp8_gemm", **SMALL_TILES):
        out = fp8_gemm(a, a_scale, b, b_scale, bias, out_dtype)
        params = {**launch_params_for_rows("fp8_gemm", device, m), "backend": "triton"}
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert_within_error_model(out, a, a_scale, b, b_scale, bias, params)
    assert_within_error_model(fp8_gemm_ref(a, a_scale, b, b_scale, bias, out_dtype), a, a_scale, b, b_scale, bias)


@pytest.mark.parametrize("m", [1, 64, *in_full_run(300)])
@pytest.mark.parametrize("imprecise", [None, 128])
@pytest.mark.parametrize("k", [1024, 200])  # K tiles whole, and a partial one
def test_fp8_gemm_with_configured_tiles_matches_ref(gen, device, m, imprecise, k):
    """The launch config's tiles for M rows (on a Hopper GPU from 64 rows the FP8 tensor cores, whose adds
    keep 14 bits unless promoted to float32 every `max_num_imprecise_acc` of K: fp8_gemm_error_bound's fast
    accumulation; below 64 rows fp16 mma.sync with float32 sums)."""
    n = 256
    a, a_scale = quantize_fp8_per_token_ref(randn(gen, m, k, device=device))
    b, b_scale = quantize_fp8_weight_ref(randn(gen, n, k, device=device) / k**0.5)
    with override_launch_params("fp8_gemm", max_num_imprecise_acc=imprecise):
        out = fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
        params = {**launch_params_for_rows("fp8_gemm", device, m), "backend": "triton"}
    assert_within_error_model(out, a, a_scale, b, b_scale, params=params)


def test_fp8_gemm_ref_is_the_dequantized_product(gen):
    """The reference itself, against float64 on the dequantized operands."""
    a, a_scale = quantize_fp8_per_token_ref(randn(gen, 9, 64))
    b, b_scale = quantize_fp8_weight_ref(randn(gen, 24, 64))
    exact = (a.double() * a_scale.double()[:, None]) @ (b.double() * b_scale.double()[:, None]).T
    torch.testing.assert_close(fp8_gemm_ref(a, a_scale, b, b_scale, out_dtype=torch.float32).double(), exact,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("rows", [1, 6, 40])
def test_fp8_linear_matches_ref(gen, device, dtype, static, rows):
    x = randn(gen, rows, 72, dtype=dtype, device=device, scale=2.0)
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, 56, 72, device=device) / 72**0.5)
    bias = randn(gen, 56, dtype=dtype, device=device)
    input_scale = torch.tensor(0.01, device=device) if static else None
    with override_launch_params("fp8_gemm", **SMALL_TILES):
        out = fp8_linear(x, weight, weight_scale, bias, input_scale)
        params = linear_params(x, weight)
    assert out.dtype == dtype
    # x quantized as the reference does, bit for bit (a scale an ulp off moves whole e4m3 steps: beyond the bound)
    a, a_scale = quantize_fp8_per_token_ref(x, input_scale)
    assert_within_error_model(out, a, a_scale, weight, weight_scale, bias, params)
    assert_within_error_model(fp8_linear_ref(x, weight, weight_scale, bias, input_scale), a, a_scale, weight,
                              weight_scale, bias)


@pytest.mark.parametrize("rows", [1, 40])
def test_fp8_matmul_on_quantized_rows_is_fp8_linear(gen, device, rows):
    """The down projection's path (rows quantized by the gate's kernel, then fp8_matmul) gives fp8_linear's result."""
    x = randn(gen, rows, 96, dtype=torch.bfloat16, device=device, scale=2.0)
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, 48, 96, device=device) / 96**0.5)
    bias = randn(gen, 48, dtype=torch.bfloat16, device=device)
    with override_launch_params("fp8_gemm", **SMALL_TILES):
        expected = fp8_linear(x, weight, weight_scale, bias)
        out = fp8_matmul(*quantize_fp8_per_token(x), weight, weight_scale, bias, torch.bfloat16)
    assert torch.equal(out, expected)


def test_fp8_linear_stays_close_to_the_unquantized_product(gen, device):
    """What W8A8 costs: against x W^T in float64 on the unquantized operands, a few percent at most."""
    x = randn(gen, 16, 256, device=device)
    w = randn(gen, 64, 256, device=device) / 16
    weight, weight_scale = quantize_fp8_weight_ref(w)
    out = fp8_linear(x, weight, weight_scale)
    exact = x.double() @ w.double().T
    assert ((out.double() - exact).norm() / exact.norm()) < 0.05


def test_row_buckets_pick_the_smallest_that_holds_the_rows():
    """default.json's fp8_gemm (a CPU's, whatever the GPU): "m<=16" and "m<=32" buckets over the default tiles."""
    device = torch.device("cpu")
    assert launch_params_for_rows("fp8_gemm", device, 1)["BLOCK_M"] == 16
    assert launch_params_for_rows("fp8_gemm", device, 16)["BLOCK_M"] == 16
    assert launch_params_for_rows("fp8_gemm", device, 17)["BLOCK_M"] == 32
    assert launch_params_for_rows("fp8_gemm", device, 33)["BLOCK_M"] == launch_params_for_rows(
        "fp8_gemm", device, 10**6)["BLOCK_M"] == 64
    with override_launch_params("fp8_gemm", BLOCK_M=128):  # overrides win over the bucket
        assert launch_params_for_rows("fp8_gemm", device, 1)["BLOCK_M"] == 128


def test_a_scaled_mm_bucket_on_the_cpu_runs_triton(gen, device):
    """torch._scaled_mm runs only on CUDA: elsewhere, and for shapes it refuses, the Triton GEMM does."""
    x = randn(gen, 3, 40, dtype=torch.bfloat16, device=device)  # K = 40: not a multiple of 16
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, 24, 40, device=device))
    with override_launch_params("fp8_gemm", backend="scaled_mm"):
        out = fp8_linear(x, weight, weight_scale)
        params = linear_params(x, weight)
    assert params["backend"] == "triton"
    assert_within_error_model(out, *quantize_fp8_per_token_ref(x), weight, weight_scale, params=params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch._scaled_mm needs CUDA")
@pytest.mark.parametrize("rows", [1, 64, 300])
def test_scaled_mm_backend_matches_ref(gen, rows):
    x = randn(gen, rows, 256, dtype=torch.bfloat16, device="cuda")
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, 128, 256, device="cuda") / 16)
    bias = randn(gen, 128, dtype=torch.bfloat16, device="cuda")
    with override_launch_params("fp8_gemm", backend="scaled_mm"):
        out = fp8_linear(x, weight, weight_scale, bias)
        params = linear_params(x, weight)
    assert params["backend"] == "scaled_mm"
    # cuBLAS's fast accumulation (use_fast_accum), K perhaps split, the bias added in bf16 after its rounding.
    assert_within_error_model(out, *quantize_fp8_per_token_ref(x), weight, weight_scale, bias, params)


def test_bad_input_is_refused(device):
    x = torch.zeros(2, 32, device=device)
    weight = torch.zeros(8, 32, device=device).to(FP8)
    scale = torch.ones(8, device=device)
    with pytest.raises(ValueError, match="weight must have dtype in"):
        fp8_linear(x, weight.float(), scale)
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(8,\)"):
        fp8_linear(x, weight, scale[:4])
    with pytest.raises(ValueError, match="x has 16 features but weight takes 32"):
        fp8_linear(x[:, :16], weight, scale)
    with pytest.raises(ValueError, match="static_scale must hold one value"):
        quantize_fp8_per_token(x, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="a must have dtype in"):
        fp8_gemm(x, torch.ones(2, device=device), weight, scale)


# --- skinny_linear with FP8 weights --------------------------------------------------------------

SKINNY_TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=4e-2, rtol=3e-2)}
MODES = {"plain": {}, "norm": {"norm_weight": True, "eps": 1e-5}, "gated": {"gated": True},
         "norm, swiglu out": {"norm_weight": True, "eps": 1e-5, "swiglu": True}}


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, SKINNY_MAX_ROWS])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("cuda_cores", [False, True])  # one row on the CUDA cores, or tl.dot
def test_skinny_linear_with_fp8_weights_matches_ref(gen, device, dtype, rows, mode, cuda_cores):
    out_features, in_features = 40, 100  # partial N and K tiles
    options = dict(MODES[mode])
    x = randn(gen, rows, in_features * (2 if options.get("gated") else 1), dtype=dtype, device=device)
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, out_features, in_features, device=device) / 10)
    bias = randn(gen, out_features, dtype=dtype, device=device)
    if options.get("norm_weight"):
        options["norm_weight"] = randn(gen, in_features, dtype=dtype, device=device)
    # swiglu's output is the activation, not added into a residual
    residual = None if options.get("swiglu") else randn(gen, rows, out_features, dtype=dtype, device=device)
    expected = skinny_linear_ref(x, weight, bias, residual=None if residual is None else residual.clone(),
                                 weight_scale=weight_scale, **options)
    # on the CUDA cores, the weights loaded 8 to a thread as h200.json has it
    with override_launch_params("skinny_linear", single_row_on_cuda_cores=cuda_cores, BLOCK_N=8 if cuda_cores else 16,
                                BLOCK_K=32, weight_vector=8 if cuda_cores else 0):
        out = skinny_linear(x, weight, bias, residual=residual, weight_scale=weight_scale, **options)
    assert out is residual if residual is not None else out.shape == (rows, out_features // 2)
    torch.testing.assert_close(out.float(), expected.float(), **SKINNY_TOLERANCE[dtype])


def test_skinny_ref_with_fp8_weights_is_the_dequantized_product(gen):
    x = randn(gen, 2, 64)
    weight, weight_scale = quantize_fp8_weight_ref(randn(gen, 24, 64))
    expected = x.double() @ (weight.double() * weight_scale.double()[:, None]).T
    torch.testing.assert_close(skinny_linear_ref(x, weight, weight_scale=weight_scale).double(), expected,
                               atol=1e-5, rtol=1e-5)


def test_fp8_weights_have_their_own_max_rows(device):
    x = torch.zeros(4, 32, device=device)
    with override_launch_params("skinny_linear", max_rows=8):
        assert fits_skinny_linear(x, FP8) and fits_skinny_linear(x)


def test_skinny_linear_refuses_fp8_weights_without_scales(device):
    weight = torch.zeros(8, 32, device=device).to(FP8)
    with pytest.raises(ValueError, match="need their weight_scale"):
        skinny_linear(torch.zeros(1, 32, device=device), weight)
    with pytest.raises(ValueError, match="weight_scale is for float8_e4m3fn weights"):
        skinny_linear(torch.zeros(1, 32, device=device), weight.float(), weight_scale=torch.ones(8, device=device))
