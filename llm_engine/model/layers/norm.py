"""RMSNorm, fused with the residual add that precedes it."""
from __future__ import annotations

import torch
from torch import nn

from llm_engine.model import ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None):
        """-> norm(x), or with residual -> (norm(x + residual), residual), residual updated in place
        to x + residual; the normed rows into `out` if given."""
        return ops.rms_norm(x, self.weight, self.eps, residual, out=out)
