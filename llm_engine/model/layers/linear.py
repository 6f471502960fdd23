"""Dense projections (cuBLAS matmuls) whose weights the loader fills by name."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T (+ b). Parameters are created uninitialised: the checkpoint overwrites them."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Projections of one input stacked along the output dim (q|k|v, gate|up): one matmul, not several.

    `output_sizes` maps each shard id to its rows; the loader copies checkpoint tensor `shard_id`
    into rows `shard_offsets[shard_id]` of weight (and bias).
    """

    def __init__(self, in_features: int, output_sizes: dict[object, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(output_sizes.values()), bias)
        offsets, start = {}, 0
        for shard_id, size in output_sizes.items():
            offsets[shard_id] = (start, size)
            start += size
        for param in (self.weight, self.bias):
            if param is not None:
                param.shard_offsets = offsets
