"""Launch parameters: the configured values, dtype overlays, and overrides that do not leak."""
from __future__ import annotations

import pytest
import torch

from llm_engine.kernels.launch_config import family_for_name, launch_params, override_launch_params

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


@pytest.mark.parametrize(("device_name", "family"), [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h200"),   # the same Hopper tiles ("_devices")
    ("NVIDIA A100-SXM4-80GB", "default"),
])
def test_a_device_name_picks_its_launch_config(device_name, family):
    assert family_for_name(device_name) == family
