"""Rotary position embedding: the per-position cos/sin table, built once (the attention layers'
fused rotary + KV-write kernel applies it).

Frequencies follow transformers' rope init functions (default, linear, llama3) op for op, so the
table matches HF's cos/sin bit for bit in float32.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def compute_inv_freq(head_dim: int, base: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """float32 [head_dim // 2] inverse frequencies, on CPU (the table is built there once)."""
    # On CPU explicitly (the model is built under a CUDA default device): the same float ops as HF's init.
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    rope_type = rope_scaling["rope_type"] if rope_scaling else "default"
    if rope_type == "linear":
        return inv_freq / rope_scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly between.
    factor = scaling["factor"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def compute_cos_sin_cache(head_dim: int, max_position: int, base: float,
                          rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    """float32 [max_position, head_dim]: cos of the position's angles in the first half, sin in the second."""
    inv_freq = compute_inv_freq(head_dim, base, rope_scaling)
    freqs = torch.arange(max_position, dtype=torch.float32, device="cpu")[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    """The table, one per model, shared by its attention layers (it depends on positions only)."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 rope_scaling: dict[str, Any] | None) -> None:
        super().__init__()
        cache = compute_cos_sin_cache(head_dim, max_position, base, rope_scaling)
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_device()), persistent=False)
