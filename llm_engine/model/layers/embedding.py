"""Token embedding lookup and the LM head's logits (the LM head may share the embedding matrix).

With tensor parallelism the vocabulary is split: each rank holds a contiguous block of
ceil(vocab / size) rows (the last block zero-padded). A lookup outside a rank's block yields
zeros there and the ranks' lookups are summed; the LM head's per-rank logits are gathered on rank 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llm_engine.model.layers.parallel_linear import shard_param
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup


def vocab_rows_per_rank(vocab_size: int, tp: TensorParallelGroup) -> int:
    return -(-vocab_size // tp.size)


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        rows = vocab_rows_per_rank(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(rows, hidden_size), requires_grad=False)
        shard_param(self.weight, 0, tp, padded=True)
        self.vocab_start = tp.rank * rows
        self.tp = tp

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0))


def compute_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: int,
                   tp: TensorParallelGroup) -> torch.Tensor | None:
    """float32 logits [N, vocab] of hidden [N, hidden] (None on ranks other than 0)."""
    logits = F.linear(hidden, weight)
    if tp.size > 1:
        # Gathered in the model dtype, then cast: the same values as one rank's F.linear, half the bytes.
        logits = tp.gather(logits)
        if logits is None:
            return None
        logits = logits[:, :vocab_size]
    return logits.float()
