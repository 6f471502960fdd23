"""Dense projections whose weights the loader fills by name: cuBLAS matmuls, or FP8 (W8A8) ones.

An FP8 projection (`quant` given: llm_engine/quantization.py) holds `weight` as float8_e4m3fn [out, in]
with a float32 `weight_scale` [out] (per output channel), and, for a checkpoint with static activation
scales, a scalar `input_scale`; it multiplies through ops.fp8_linear (x quantized per token, or by the
input scale, then the FP8 GEMM), or, given x already quantized per token (QuantizedRows: the kernel before
quantized its own output), through ops.fp8_matmul. The loader fills `weight_scale` from the checkpoint, or,
quantizing an unquantized checkpoint as it loads, from each weight it quantizes (model/loader.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.model import ops
from llm_engine.quantization import LinearQuant

FP8 = torch.float8_e4m3fn


class QuantizedRows(NamedTuple):
    """Activations quantized per token: e4m3 values [M, K], float32 scales [M], and the dtype they stand for."""
    values: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


class Linear(nn.Module):
    """y = x W^T (+ b). Parameters are created uninitialised: the checkpoint overwrites them."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 quant: LinearQuant | None = None) -> None:
        super().__init__()
        self.quant = quant
        self.weight_scale = self.input_scale = None
        if quant is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        else:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
            self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
            self.weight.fp8_scale = self.weight_scale  # where the loader puts the scales of what it quantizes
            self.weight_scale.fp8_kind = "weight_scale"
            if quant.online:
                self.weight_scale.from_checkpoint = False  # filled with the weight, not read
            if quant.static_input:
                # The largest of the stacked checkpoint modules' scales (they share the input): 0 until read.
                self.input_scale = nn.Parameter(torch.zeros((), dtype=torch.float32), requires_grad=False)
                self.input_scale.fp8_kind = "input_scale"
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    @property
    def takes_quantized_rows(self) -> bool:
        """FP8 weights with per-token activation scales: x may come as QuantizedRows."""
        return self.weight_scale is not None and self.input_scale is None

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def matmul(self, x: torch.Tensor | QuantizedRows, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + bias (the given bias: a row-parallel rank adds its own or none)."""
        if isinstance(x, QuantizedRows):
            return ops.fp8_matmul(x.values, x.scale, self.weight, self.weight_scale, bias, x.dtype)
        if self.weight_scale is None:
            return F.linear(x, self.weight, bias)
        return ops.fp8_linear(x, self.weight, self.weight_scale, bias, self.input_scale)


class MergedLinear(Linear):
    """Projections of one input stacked along the output dim (q|k|v, gate|up): one matmul, not several.

    `output_sizes` maps each shard id to its rows; the loader copies checkpoint tensor `shard_id`
    into rows `shard_offsets[shard_id]` of weight (and bias, and an FP8 weight's scales).
    """

    def __init__(self, in_features: int, output_sizes: dict[object, int], bias: bool = False,
                 quant: LinearQuant | None = None) -> None:
        super().__init__(in_features, sum(output_sizes.values()), bias, quant)
        offsets, start = {}, 0
        for shard_id, size in output_sizes.items():
            offsets[shard_id] = (start, size)
            start += size
        for param in (self.weight, self.bias, self.weight_scale):
            if param is not None:
                param.shard_offsets = offsets
