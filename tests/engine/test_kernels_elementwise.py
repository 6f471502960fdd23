"""RMSNorm and SiLU-and-mul kernels against their torch references, and the rotary reference against
HF's formula (the fused rotary + KV-write kernel: test_kernels_paged.py)."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kernels import (
    apply_rotary_ref,
    rms_norm,
    rms_norm_ref,
    silu_and_mul,
    silu_and_mul_ref,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Outputs are compared in float32. Half-precision outputs may differ by one rounding step
# (2^-7 relative for bf16; the interpreter truncates float32 -> bf16 where GPUs round).
TOLERANCE = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
}


def randn(gen, *shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def assert_close(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCE[expected.dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, hidden_size", [(1, 64), (5, 96), (7, 128)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_ref(gen, device, dtype, num_tokens, hidden_size, with_residual):
    x = randn(gen, num_tokens, hidden_size, dtype=dtype, device=device)
    weight = randn(gen, hidden_size, dtype=dtype, device=device)
    residual = randn(gen, num_tokens, hidden_size, dtype=dtype, device=device) if with_residual else None
    x_before = x.clone()
    own = None if residual is None else residual.clone()  # updated in place
    actual = rms_norm(x, weight, 1e-6, own)
    expected = rms_norm_ref(x, weight, 1e-6, None if residual is None else residual.clone())
    assert torch.equal(x, x_before)
    if with_residual:
        assert actual[1] is own
        assert_close(actual[0], expected[0])
        assert_close(actual[1], expected[1])
        assert_close(own, (x.float() + residual.float()).to(dtype))
    else:
        assert_close(actual, expected)


@pytest.mark.parametrize("op", [rms_norm, rms_norm_ref])
def test_rms_norm_writes_into_a_given_output(gen, device, op):
    x, weight, residual = (randn(gen, *shape, dtype=torch.float32, device=device)
                           for shape in ((6, 64), (64,), (6, 64)))
    buffer = torch.zeros(8, 64, device=device)
    out, res = op(x, weight, 1e-6, residual.clone(), out=buffer[1:7])
    assert out.data_ptr() == buffer[1].data_ptr()
    assert_close(out, rms_norm_ref(x, weight, 1e-6, residual.clone())[0])
    assert not buffer[0].any() and not buffer[7].any()


def test_rms_norm_ref_formula(gen):
    x = torch.randn(3, 16, generator=gen, dtype=torch.float64)
    weight = torch.randn(16, generator=gen, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * weight
    torch.testing.assert_close(rms_norm_ref(x.float(), weight.float(), 1e-5), expected.float())


def cos_sin_cache(max_position, head_dim, device):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device)


def test_apply_rotary_ref_matches_hf_llama_rotate_half(gen):
    q = torch.randn(4, 2, 8, generator=gen)
    k = torch.randn(4, 1, 8, generator=gen)
    positions = torch.tensor([0, 3, 9, 1])
    cache = cos_sin_cache(16, 8, "cpu")
    cos_half, sin_half = cache[positions].chunk(2, dim=-1)
    cos = torch.cat((cos_half, cos_half), dim=-1)[:, None, :]
    sin = torch.cat((sin_half, sin_half), dim=-1)[:, None, :]

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    q_ref, k_ref = apply_rotary_ref(q, k, positions, cache)
    torch.testing.assert_close(q_ref, q * cos + rotate_half(q) * sin)
    torch.testing.assert_close(k_ref, k * cos + rotate_half(k) * sin)
    # Position 0 is the identity rotation.
    torch.testing.assert_close(q_ref[0], q[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, intermediate_size", [(1, 64), (3, 300), (2, 1100)])
def test_silu_and_mul_matches_ref(gen, device, dtype, num_tokens, intermediate_size):
    x = randn(gen, num_tokens, 2 * intermediate_size, dtype=dtype, device=device)
    assert_close(silu_and_mul(x), silu_and_mul_ref(x))


def test_silu_and_mul_ref_formula(gen):
    x = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    gate, up = x[:, :3], x[:, 3:]
    expected = gate / (1 + torch.exp(-gate)) * up
    torch.testing.assert_close(silu_and_mul_ref(x.float()), expected.float())


def test_contract_violations_name_the_argument(device):
    x = torch.ones(2, 8, device=device)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(4, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, torch.ones(8, device=device), 1e-6, residual=torch.ones(2, 4, device=device))
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.ones(2, 7, device=device))
