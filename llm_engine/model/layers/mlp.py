"""The SwiGLU feed-forward block: down(silu(gate(x)) * up(x)) with gate and up fused. With FP8 weights
and per-token activation scales, the gate's kernel quantizes its output for the down projection."""
from __future__ import annotations

import torch
from torch import nn

from llm_engine.model import ops
from llm_engine.model.layers.linear import QuantizedRows
from llm_engine.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
from llm_engine.quantization import Fp8Quantization
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup


class GatedMLP(nn.Module):
    """`intermediate_size` is this rank's share of the MLP width (all of it at tensor-parallel size 1).
    `quant`, `prefix`: the FP8 plan and the checkpoint's name of this block ("model.layers.0.mlp")."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp: TensorParallelGroup = SINGLE,
                 quant: Fp8Quantization | None = None, prefix: str = "mlp") -> None:
        super().__init__()
        def plan(*modules: str):
            return quant.for_module([f"{prefix}.{m}" for m in modules]) if quant else None

        self.gate_up_proj = ColumnParallelLinear(hidden_size, {0: intermediate_size, 1: intermediate_size},
                                                 bias=False, tp=tp, quant=plan("gate_proj", "up_proj"))
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, tp=tp,
                                           quant=plan("down_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.down_proj.takes_quantized_rows:
            return self.down_proj(QuantizedRows(*ops.silu_and_mul_quantize_fp8(gate_up), gate_up.dtype))
        return self.down_proj(ops.silu_and_mul(gate_up))
