"""The SwiGLU feed-forward block: down(silu(gate(x)) * up(x)) with gate and up fused."""
from __future__ import annotations

import torch
from torch import nn

from llm_engine.model import ops
from llm_engine.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup


class GatedMLP(nn.Module):
    """`intermediate_size` is this rank's share of the MLP width (all of it at tensor-parallel size 1)."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.gate_up_proj = ColumnParallelLinear(hidden_size, {0: intermediate_size, 1: intermediate_size},
                                                 bias=False, tp=tp)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))
