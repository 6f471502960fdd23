"""Launch parameters: the configured values, dtype overlays, and overrides that do not leak."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kernels.launch_config import launch_params, override_launch_params

CPU = torch.device("cpu")


def test_dtype_overlays_and_overrides_apply_and_end_with_their_block():
    base = launch_params("paged_decode_attention", CPU, torch.bfloat16, torch.bfloat16)
    fp32 = launch_params("paged_decode_attention", CPU, torch.float32, torch.float32)
    assert set(base) == set(fp32)
    with override_launch_params("paged_decode_attention", BLOCK_N=16):
        assert launch_params("paged_decode_attention", CPU, torch.bfloat16, torch.bfloat16)["BLOCK_N"] == 16
    assert launch_params("paged_decode_attention", CPU, torch.bfloat16, torch.bfloat16) == base


def test_an_unknown_override_names_the_parameters():
    with override_launch_params("rms_norm", BLOCK=3), pytest.raises(KeyError, match="no launch parameters"):
        launch_params("rms_norm", CPU)
