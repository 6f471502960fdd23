"""The SwiGLU feed-forward block: down(silu(gate(x)) * up(x)) with gate and up fused."""
from __future__ import annotations

import torch
from torch import nn

from llm_engine import ops
from llm_engine.layers.linear import Linear, MergedLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden_size, {0: intermediate_size, 1: intermediate_size})
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))
