"""Megatron-style tensor-parallel projections.

Column-parallel: each rank holds a block of output rows (its heads, its MLP columns) and keeps its
output to itself. Row-parallel: each rank holds the matching block of input columns; the partial
products are summed by one all-reduce. A column-parallel layer followed by a row-parallel one
(qkv -> o, gate_up -> down) thus communicates once. At size 1 both are plain Linear layers.

`shard_param` records which slice of the checkpoint tensor a parameter holds; the loader reads
just that slice.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llm_engine.model.layers.linear import Linear, MergedLinear
from llm_engine.quantization import LinearQuant
from llm_engine.worker.distributed import TensorParallelGroup


@dataclass(frozen=True)
class TensorShard:
    dim: int        # the split dimension of the checkpoint tensor
    rank: int       # this rank holds block `rank` of `size` along dim
    size: int
    padded: bool    # the tensor may be short of size blocks (the vocabulary); missing rows are zero


def shard_param(param: nn.Parameter | None, dim: int, tp: TensorParallelGroup, padded: bool = False) -> None:
    if param is not None and tp.size > 1:
        param.tensor_shard = TensorShard(dim, tp.rank, tp.size, padded)


class ColumnParallelLinear(MergedLinear):
    """MergedLinear over this rank's rows of each stacked projection (`output_sizes` per rank)."""

    def __init__(self, in_features: int, output_sizes: dict[object, int], bias: bool,
                 tp: TensorParallelGroup, quant: LinearQuant | None = None) -> None:
        super().__init__(in_features, output_sizes, bias, quant)
        shard_param(self.weight, 0, tp)
        shard_param(self.bias, 0, tp)
        shard_param(self.weight_scale, 0, tp)  # an FP8 weight's rows keep their scales


class RowParallelLinear(Linear):
    """y = sum over ranks of x_rank W_rank^T, + b once (`in_features` per rank). An FP8 weight's scales
    cover every output row on each rank: quantized at load, from that rank's columns alone."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallelGroup,
                 quant: LinearQuant | None = None) -> None:
        super().__init__(in_features, out_features, bias, quant)
        shard_param(self.weight, 1, tp)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.matmul(x, self.bias)
        # The bias is replicated: only rank 0 adds it, so the sum holds it once.
        return self.tp.all_reduce(self.matmul(x, self.bias if self.tp.rank == 0 else None))
