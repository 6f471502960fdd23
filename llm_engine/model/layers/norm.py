"""RMSNorm, fused with the residual add that precedes it, and for an FP8 projection with the per-token
quantization after it."""
from __future__ import annotations

import torch
from torch import nn

from llm_engine.model import ops
from llm_engine.model.layers.linear import Linear, QuantizedRows


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None):
        """-> norm(x), or with residual -> (norm(x + residual), residual), residual updated in place
        to x + residual; the normed rows into `out` if given."""
        return ops.rms_norm(x, self.weight, self.eps, residual, out=out)

    def for_projection(self, projection: Linear, x: torch.Tensor, residual: torch.Tensor | None = None
                       ) -> torch.Tensor | QuantizedRows:
        """norm(x), or norm(x + residual) with residual updated in place, as `projection` takes it: quantized
        per token by the norm's own kernel when its FP8 weights take QuantizedRows."""
        if projection.takes_quantized_rows:
            return QuantizedRows(*ops.rms_norm_quantize_fp8(x, self.weight, self.eps, residual), x.dtype)
        normed = self(x, residual)
        return normed if residual is None else normed[0]
