"""The weight-streaming matmul of small decode batches against its torch reference (F.linear)."""
from __future__ import annotations

import pytest
import torch

from llm_engine import ops
from llm_engine.kernels import SKINNY_MAX_ROWS, fits_skinny_matmul, skinny_matmul, skinny_matmul_ref

# Compared in float32: the kernel and cuBLAS/torch sum in different orders; bf16 outputs may
# differ by a rounding step.
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=2e-2)}


def randn(gen, *shape, dtype, device):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, SKINNY_MAX_ROWS])
@pytest.mark.parametrize("out_features, in_features", [(16, 64), (40, 96), (100, 200)])  # partial N and K tiles
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_matmul_matches_ref(gen, device, dtype, rows, out_features, in_features, with_bias):
    x = randn(gen, rows, in_features, dtype=dtype, device=device)
    weight = randn(gen, out_features, in_features, dtype=dtype, device=device) / in_features**0.5
    bias = randn(gen, out_features, dtype=dtype, device=device) if with_bias else None
    out = skinny_matmul(x, weight, bias)
    expected = skinny_matmul_ref(x, weight, bias)
    assert out.dtype == dtype and out.shape == (rows, out_features)
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCE[dtype])


def test_skinny_matmul_row_views(gen, device):
    """Rows gathered or sliced from a larger activation (the LM head's sampled rows) keep their stride."""
    hidden = randn(gen, 9, 64, dtype=torch.float32, device=device)
    weight = randn(gen, 24, 64, dtype=torch.float32, device=device)
    x = hidden[::2]
    torch.testing.assert_close(skinny_matmul(x, weight), skinny_matmul_ref(x, weight), atol=1e-4, rtol=1e-4)


def test_skinny_matmul_refuses_bad_input(device):
    weight = torch.zeros(8, 32, device=device)
    with pytest.raises(ValueError, match=f"at most {SKINNY_MAX_ROWS}"):
        skinny_matmul(torch.zeros(SKINNY_MAX_ROWS + 1, 32, device=device), weight)
    with pytest.raises(ValueError, match="32"):
        skinny_matmul(torch.zeros(2, 16, device=device), weight)
    with pytest.raises(ValueError, match="dtype"):
        skinny_matmul(torch.zeros(2, 32, device=device, dtype=torch.bfloat16), weight)


def test_linear_takes_the_kernel_only_for_small_batches(device):
    weight = torch.zeros(8, 32, device=device)
    assert fits_skinny_matmul(torch.zeros(1, 32, device=device))
    assert fits_skinny_matmul(torch.zeros(SKINNY_MAX_ROWS, 32, device=device))
    assert not fits_skinny_matmul(torch.zeros(SKINNY_MAX_ROWS + 1, 32, device=device))
    assert not fits_skinny_matmul(torch.zeros(0, 32, device=device))
    assert ops.linear(torch.ones(SKINNY_MAX_ROWS + 1, 32, device=device), weight).shape == (SKINNY_MAX_ROWS + 1, 8)
