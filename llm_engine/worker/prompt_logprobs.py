"""Prompt logprobs (SamplingParams.prompt_logprobs, as vLLM's): each prompt token's logprob given the
tokens before it, its rank there and the N most likely tokens, from the model's raw logits.

The scheduler names the prompt positions a step scores (ScheduledBatch.prompt_rows); the logits at
position p score token p + 1, which the prompt holds even where a later chunk computes it. Their rows
go through the LM head in slices of at most max_num_seqs rows (and SLICE_ROWS), so that their float32
logits take no more memory than a warm-up step's sampled rows, which sized the KV pool; log_softmax and
the ranks take about as much again at the peak.
"""
from __future__ import annotations

import torch

from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.outputs import TopLogprobs
from llm_engine.worker.host_copy import HostCopy
from llm_engine.worker.sampler import token_logprobs

SLICE_ROWS = 256


def score_prompt_rows(model, hidden: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, top: int,
                      slice_rows: int) -> PromptLogprobs | None:
    """The scores of hidden[rows] against targets, `slice_rows` at a time (None on tensor-parallel ranks
    other than 0, which take part in each slice's LM head all the same)."""
    parts = []
    for a in range(0, rows.numel(), slice_rows):
        logits = model.compute_logits(hidden[rows[a:a + slice_rows]])
        if logits is not None:
            parts.append(token_logprobs(logits, targets[a:a + slice_rows].long(), [top]))
    return PromptLogprobs(tuple(torch.cat(p) for p in zip(*parts))) if parts else None


class PromptLogprobs:
    """One step's prompt scores on their way to the host, in the order of the batch's prompt_rows."""

    def __init__(self, scores: tuple[torch.Tensor, ...]) -> None:
        self._copy = HostCopy(*scores)

    def add_to(self, batch: ScheduledBatch) -> None:
        """Append each scored position's logprob and TopLogprobs to its sequence."""
        host = self._copy.wait()
        logprobs, ranks = host[0].tolist(), host[1].tolist()
        top_ids, top_lps = (host[2].tolist(), host[3].tolist()) if len(host) == 4 else ((), ())
        row = 0
        for i, _, count in batch.prompt_rows:
            seq = batch.seqs[i]
            n = seq.sampling_params.prompt_logprobs
            for r in range(row, row + count):
                seq.prompt_logprobs.append(logprobs[r])
                seq.prompt_top_logprobs.append(
                    TopLogprobs(ranks[r], dict(zip(top_ids[r][:n], top_lps[r][:n])) if n else {}))
            row += count
