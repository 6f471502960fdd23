"""The fused small-batch projection (plain, after RMSNorm, after the SwiGLU gate; into a residual; ending in
the SwiGLU gate) against its torch reference, which composes the unfused ops: rms_norm_ref, silu_and_mul_ref,
F.linear, the add."""
from __future__ import annotations

import pytest
import torch
from tiers import FLOAT32_IN_FULL_RUN, in_full_run

from llm_engine.kernels import SKINNY_MAX_ROWS, fits_skinny_linear, skinny_linear, skinny_linear_ref
from llm_engine.kernels.launch_config import override_launch_params

# Compared in float32: the kernel and torch sum in different orders, so bf16 outputs may differ by a
# rounding step (and the interpreter truncates float32 -> bf16 where GPUs round).
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=4e-2, rtol=3e-2)}
MODES = {
    "plain": {},
    "norm": {"norm_weight": True, "eps": 1e-5},
    "gated": {"gated": True},
    "norm, swiglu out": {"norm_weight": True, "eps": 1e-5, "swiglu": True},  # the MLP's gate_up
}


def out_width(options, out_features):
    return out_features // 2 if options.get("swiglu") else out_features


def randn(gen, *shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, *in_full_run(3), SKINNY_MAX_ROWS])
@pytest.mark.parametrize("out_features, in_features",  # partial N and K tiles
                         [*in_full_run((16, 64)), (40, 96), *in_full_run((100, 200))])
@pytest.mark.parametrize("mode, with_bias, into_residual", [
    pytest.param(mode, bias, into, marks=[pytest.mark.slow] if slow else [], id=f"{mode}-{bias}-{into}")
    for mode in MODES
    for bias, into, slow in ((False, False, False), (True, False, True), (False, True, True), (True, True, False))
    if not (into and MODES[mode].get("swiglu"))])  # swiglu's output is the activation, into no residual
def test_skinny_linear_matches_ref(gen, device, dtype, rows, out_features, in_features, mode, with_bias,
                                   into_residual):
    options = dict(MODES[mode])
    x = randn(gen, rows, in_features * (2 if options.get("gated") else 1), dtype=dtype, device=device)
    weight = randn(gen, out_features, in_features, dtype=dtype, device=device) / in_features**0.5
    bias = randn(gen, out_features, dtype=dtype, device=device) if with_bias else None
    if options.get("norm_weight"):
        options["norm_weight"] = randn(gen, in_features, dtype=dtype, device=device)
    residual = randn(gen, rows, out_features, dtype=dtype, device=device) if into_residual else None
    expected = skinny_linear_ref(x, weight, bias, residual=None if residual is None else residual.clone(), **options)
    out = skinny_linear(x, weight, bias, residual=residual, **options)
    if into_residual:
        assert out is residual  # in place
    assert out.dtype == dtype and out.shape == (rows, out_width(options, out_features))
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [FLOAT32_IN_FULL_RUN, torch.bfloat16])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("block_n", [4, 16])
@pytest.mark.parametrize("pdl", [False, *in_full_run(True)])  # the interpreter launches plainly either way
@pytest.mark.parametrize("in_features", [*in_full_run(96), 100])  # whole and partial K tiles
def test_single_row_on_cuda_cores_matches_ref(gen, device, dtype, mode, block_n, pdl, in_features):
    """The launch config may send a single row through products summed on the CUDA cores (no tl.dot,
    so tiles narrower than 16 columns too), with programmatic dependent launch on a GPU (the
    interpreter launches plainly); tiles of 32 take the loop through several tiles."""
    options = dict(MODES[mode])
    x = randn(gen, 1, in_features * (2 if options.get("gated") else 1), dtype=dtype, device=device)
    weight = randn(gen, 40, in_features, dtype=dtype, device=device) / in_features**0.5
    if options.get("norm_weight"):
        options["norm_weight"] = randn(gen, in_features, dtype=dtype, device=device)
    residual = None if options.get("swiglu") else randn(gen, 1, 40, dtype=dtype, device=device)
    expected = skinny_linear_ref(x, weight, residual=None if residual is None else residual.clone(), **options)
    with override_launch_params("skinny_linear", single_row_on_cuda_cores=True, BLOCK_N=block_n, BLOCK_K=32,
                                programmatic_dependent_launch=pdl):
        out = skinny_linear(x, weight, residual=residual, **options)
    assert out.shape == (1, out_width(options, 40))
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype])


def test_skinny_linear_row_views(gen, device):
    """Rows sliced from a larger activation, and a residual that is a row view, keep their strides."""
    hidden = randn(gen, 9, 64, dtype=torch.float32, device=device)
    weight = randn(gen, 24, 64, dtype=torch.float32, device=device)
    norm_weight = randn(gen, 64, dtype=torch.float32, device=device)
    x = hidden[::2]
    torch.testing.assert_close(skinny_linear(x, weight, norm_weight=norm_weight, eps=1e-6),
                               skinny_linear_ref(x, weight, norm_weight=norm_weight, eps=1e-6), atol=1e-4, rtol=1e-4)
    stream = randn(gen, 10, 24, dtype=torch.float32, device=device)
    expected = skinny_linear_ref(x, weight, residual=stream[::2].clone())
    out = skinny_linear(x, weight, residual=stream[::2])
    torch.testing.assert_close(stream[::2], expected, atol=1e-4, rtol=1e-4)
    assert out.data_ptr() == stream.data_ptr()


def test_skinny_linear_refuses_bad_input(device):
    weight = torch.zeros(8, 32, device=device)
    with pytest.raises(ValueError, match=f"at most {SKINNY_MAX_ROWS}"):
        skinny_linear(torch.zeros(SKINNY_MAX_ROWS + 1, 32, device=device), weight)
    with pytest.raises(ValueError, match="x has 16 features but weight takes 32"):
        skinny_linear(torch.zeros(2, 16, device=device), weight)
    with pytest.raises(ValueError, match="gated: x must be"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, gated=True)
    with pytest.raises(ValueError, match="cannot go into a residual"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, swiglu=True, residual=torch.zeros(2, 4, device=device))
    with pytest.raises(ValueError, match="an even number of rows, got 7"):
        skinny_linear(torch.zeros(2, 32, device=device), weight[:7], swiglu=True)
    with pytest.raises(ValueError, match="not both"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, norm_weight=torch.ones(32, device=device),
                      gated=True)
    with pytest.raises(ValueError, match="weight must have x's dtype"):
        skinny_linear(torch.zeros(2, 32, device=device, dtype=torch.bfloat16), weight)
    with pytest.raises(ValueError, match=r"norm_weight must have shape \(32,\)"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, norm_weight=torch.ones(8, device=device))
    with pytest.raises(ValueError, match=r"residual must have shape \(2, 8\)"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, residual=torch.zeros(2, 32, device=device))
    with pytest.raises(ValueError, match="bias must be contiguous"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, torch.zeros(16, device=device)[::2])
    with pytest.raises(ValueError, match="norm_weight must be contiguous"):
        skinny_linear(torch.zeros(2, 32, device=device), weight, norm_weight=torch.ones(64, device=device)[::2])
    square = torch.zeros(32, 32, device=device)
    stream = torch.zeros(2, 32, device=device)
    with pytest.raises(ValueError, match="residual must not share memory with x"):
        skinny_linear(stream, square, norm_weight=torch.ones(32, device=device), residual=stream)


def test_fused_path_only_for_small_batches_and_where_configured(device):
    with override_launch_params("skinny_linear", max_rows=8):
        assert fits_skinny_linear(torch.zeros(1, 32, device=device))
        assert fits_skinny_linear(torch.zeros(8, 32, device=device))
        assert not fits_skinny_linear(torch.zeros(9, 32, device=device))
        assert not fits_skinny_linear(torch.zeros(0, 32, device=device))
    with override_launch_params("skinny_linear", max_rows=0):
        assert not fits_skinny_linear(torch.zeros(1, 32, device=device))
