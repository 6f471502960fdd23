"""Batched next-token sampling over the logits of one step.

Order of processing, per row: min_tokens masking of eos/stop ids -> structured output's token mask
(a packed bitmask, kernels/token_bitmask.py) -> allowed_token_ids -> logit_bias -> repetition, frequency
and presence penalties -> temperature -> top-k -> top-p -> min-p -> pick. Greedy rows (temperature 0)
take the argmax of the penalised logits. Other rows sample with the exponential-race trick,
argmax(p / q) with q ~ Exp(1), which draws exactly from p and stays one batched op. A seeded row
draws its q from a generator seeded by (seed, output position), so its tokens do not depend on
the rest of the batch, nor on preemption.

Logprobs are those of the distribution the token was drawn from: log_softmax of the logits after
all processing above (greedy rows: after masking and penalties, temperature 1). A row that asks for
them (SamplingParams.logprobs N) also gets the token's rank in that distribution and its N most
likely tokens; all of it is computed on the device and copied to the host with the ids.

Nothing here waits for the device: per-row settings reach it through pinned memory, and the
sampled ids stay on the device (the next step's inputs are filled from them there) while their
copy to the host runs behind the step. A sequence's last output token may still be a placeholder
for the previous step's sampled ids (async scheduling): penalties read it from them on the device.
"""
from __future__ import annotations

import functools
from typing import Iterable

import torch
from torch.nn.utils.rnn import pad_sequence

from llm_engine.core.sequence import Sequence, placeholder_row
from llm_engine.model import ops
from llm_engine.outputs import TopLogprobs
from llm_engine.worker.host_copy import HostCopy, to_device

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads consecutive positions over the seed space
_MASK64 = 2**64 - 1


class SamplerOutput:
    """One step's sampled ids, and logprobs where asked for. `ids` (int32, as the step inputs
    hold them) stays on the device; the rest waits for the host copy. `logprobs` holds per row the
    logprob of the sampled token, rank and top ids / logprobs its rank and the most likely tokens."""

    def __init__(self, ids: torch.Tensor, num_logprobs: list[int | None], logprobs: tuple[torch.Tensor, ...] = ()):
        self.ids = ids
        self._num_logprobs = num_logprobs
        self._copy = HostCopy(ids, *logprobs)

    @functools.cached_property
    def token_ids(self) -> list[int]:
        return self._copy.wait()[0].tolist()

    @functools.cached_property
    def logprobs(self) -> list[float | None]:
        """Per row; None where the request did not ask for them."""
        host = self._copy.wait()
        if len(host) == 1:
            return [None] * len(self._num_logprobs)
        return [lp if n is not None else None for lp, n in zip(host[1].tolist(), self._num_logprobs)]

    @functools.cached_property
    def top_logprobs(self) -> list[TopLogprobs | None]:
        host = self._copy.wait()
        if len(host) == 1:
            return [None] * len(self._num_logprobs)
        ranks = host[2].tolist()
        top_ids, top_lps = (host[3].tolist(), host[4].tolist()) if len(host) == 5 else ([], [])
        return [None if n is None else TopLogprobs(ranks[row], dict(zip(top_ids[row][:n], top_lps[row][:n])) if n else {})
                for row, n in enumerate(self._num_logprobs)]


class Sampler:
    def __init__(self, eos_token_ids: Iterable[int]) -> None:
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], sampled_ids: torch.Tensor | None = None,
                 bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """`logits` [len(seqs), vocab] for the sampled sequences in batch order (not modified);
        `sampled_ids`: the previous step's, which placeholder tokens in `seqs` stand for; `bitmask`:
        the rows' allowed tokens (structured output), packed int32 on the host."""
        assert logits.shape[0] == len(seqs), (logits.shape, len(seqs))
        params = [s.sampling_params for s in seqs]
        logits = logits.to(torch.float32, copy=True)
        self._mask_early_stop(logits, seqs)
        if bitmask is not None:
            ops.apply_token_bitmask(logits, to_device(bitmask, torch.int32, logits.device))
        _keep_allowed(logits, params)
        _add_logit_bias(logits, params)
        logits = self._apply_penalties(logits, seqs, sampled_ids)

        device = logits.device
        # Decided on the host: a device-side all() would cost a sync every step.
        greedy_rows = [p.temperature == 0 for p in params]
        if all(greedy_rows):
            chosen = logits.argmax(dim=-1)
        else:
            greedy = to_device(greedy_rows, torch.bool, device)
            temps = to_device([p.temperature or 1.0 for p in params], torch.float32, device)
            logits.div_(temps.unsqueeze(1))
            logits = _apply_top_k_top_p(logits, params)
            logits = _apply_min_p(logits, params)
            chosen = torch.where(greedy, logits.argmax(dim=-1), self._draw(logits, seqs))

        num_logprobs = [p.logprobs for p in params]
        if all(n is None for n in num_logprobs):
            return SamplerOutput(chosen.to(torch.int32), num_logprobs)
        return SamplerOutput(chosen.to(torch.int32), num_logprobs, token_logprobs(logits, chosen, num_logprobs))

    def _mask_early_stop(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Below min_tokens, eos (unless ignored) and stop_token_ids cannot be sampled, except in a
        structured-output row: there the grammar alone decides where the output may end."""
        rows: list[int] = []
        cols: list[int] = []
        for i, seq in enumerate(seqs):
            p = seq.sampling_params
            if seq.num_output_tokens >= p.min_tokens or p.structured_outputs is not None:
                continue
            ids = list(p.stop_token_ids) + ([] if p.ignore_eos else self.eos_token_ids)
            rows += [i] * len(ids)
            cols += ids
        if rows:
            device = logits.device
            logits[to_device(rows, torch.long, device), to_device(cols, torch.long, device)] = float("-inf")

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence],
                         sampled_ids: torch.Tensor | None = None) -> torch.Tensor:
        rows = [i for i, s in enumerate(seqs) if s.sampling_params.has_penalties]
        if not rows:
            return logits
        device = logits.device
        vocab = logits.shape[1]
        params = [seqs[i].sampling_params for i in rows]

        # Padded id tensors; the pad id `vocab` scatters into an extra column that is dropped.
        def padded(lists: list[list[int]]) -> torch.Tensor:
            tensors = [torch.tensor(ids, dtype=torch.long) for ids in lists]
            return to_device(pad_sequence(tensors, batch_first=True, padding_value=vocab), torch.long, device)

        out_ids = padded([seqs[i].output_token_ids for i in rows])
        if sampled_ids is not None:  # a placeholder (the last output token) is read on the device
            rows_of = placeholder_row(out_ids).clamp_(min=0)
            out_ids = torch.where(out_ids < 0, sampled_ids.long()[rows_of], out_ids)
        prompt_ids = padded([seqs[i].token_ids[:seqs[i].num_prompt_tokens] for i in rows])
        n = len(rows)
        counts = torch.zeros(n, vocab + 1, device=device)
        counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=counts.dtype))
        counts = counts[:, :vocab]
        in_prompt = torch.zeros(n, vocab + 1, dtype=torch.bool, device=device)
        in_prompt.scatter_(1, prompt_ids, True)
        seen = in_prompt[:, :vocab] | (counts > 0)

        def column(values: list[float]) -> torch.Tensor:
            return to_device(values, torch.float32, device).unsqueeze(1)

        rep = column([p.repetition_penalty for p in params])
        freq = column([p.frequency_penalty for p in params])
        pres = column([p.presence_penalty for p in params])
        index = to_device(rows, torch.long, device)
        sub = logits[index]
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalised, sub)
        sub = sub - freq * counts - pres * (counts > 0)
        logits[index] = sub
        return logits

    def _draw(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_()
        for i, seq in enumerate(seqs):
            p = seq.sampling_params
            if p.seed is not None and p.temperature != 0:
                gen = torch.Generator(device=logits.device)
                gen.manual_seed(generator_seed(p.seed, seq.num_output_tokens))
                q[i].exponential_(generator=gen)
        return (probs / q).argmax(dim=-1)


def generator_seed(seed: int, position: int) -> int:
    """A request's seed at an output position, as a generator's seed: every int64 seed its own value (a CUDA
    generator reads all 64 bits; the CPU's reads the low 32, so on the CPU seeds alike in those draw alike)."""
    return (seed + position * _SEED_MIX) & _MASK64


def _keep_allowed(logits: torch.Tensor, params: list) -> None:
    """Every other token of a row with allowed_token_ids is masked."""
    rows = [i for i, p in enumerate(params) if p.allowed_token_ids]
    if not rows:
        return
    device = logits.device
    allowed = torch.zeros(len(rows), logits.shape[1], dtype=torch.bool, device=device)
    at = [(r, t) for r, i in enumerate(rows) for t in params[i].allowed_token_ids]
    allowed[to_device([r for r, _ in at], torch.long, device), to_device([t for _, t in at], torch.long, device)] = True
    index = to_device(rows, torch.long, device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def _add_logit_bias(logits: torch.Tensor, params: list) -> None:
    """A masked token stays masked: -inf plus a bias is -inf."""
    rows: list[int] = []
    cols: list[int] = []
    biases: list[float] = []
    for i, p in enumerate(params):
        if p.logit_bias:
            rows += [i] * len(p.logit_bias)
            cols += p.logit_bias.keys()
            biases += p.logit_bias.values()
    if rows:
        device = logits.device
        logits.index_put_((to_device(rows, torch.long, device), to_device(cols, torch.long, device)),
                          to_device(biases, torch.float32, device), accumulate=True)


def token_logprobs(logits: torch.Tensor, chosen: torch.Tensor,
                   num_logprobs: list[int | None]) -> tuple[torch.Tensor, ...]:
    """The sampled tokens' logprobs and ranks (1: the most likely), and the top ids and logprobs of
    the largest N asked for, for every row (the rows that asked for fewer keep their first N)."""
    lp = logits.log_softmax(dim=-1)
    chosen_lp = lp.gather(1, chosen.unsqueeze(1))
    rank = (lp > chosen_lp).sum(dim=-1) + 1
    k = max(n or 0 for n in num_logprobs)
    if not k:
        return chosen_lp.squeeze(1), rank
    top_lps, top_ids = lp.topk(k, dim=-1)
    return chosen_lp.squeeze(1), rank, top_ids, top_lps


def _apply_top_k_top_p(logits: torch.Tensor, params: list) -> torch.Tensor:
    vocab = logits.shape[1]
    # Greedy rows stay unfiltered so their logprobs do not depend on the batch's other rows.
    top_k = [p.top_k if 0 < p.top_k < vocab and p.temperature != 0 else vocab for p in params]
    top_p = [p.top_p if p.temperature != 0 else 1.0 for p in params]
    if all(k == vocab for k in top_k) and all(tp == 1 for tp in top_p):
        return logits
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)
    sorted_logits.masked_fill_(ranks >= to_device(top_k, torch.long, device).unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    top_p_t = to_device(top_p, torch.float32, device).unsqueeze(1)
    # Keep the smallest prefix whose mass reaches top_p; the top token always survives.
    sorted_logits.masked_fill_((mass_before >= top_p_t) & (top_p_t < 1), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _apply_min_p(logits: torch.Tensor, params: list) -> torch.Tensor:
    min_p = [p.min_p if p.temperature != 0 else 0.0 for p in params]
    if not any(min_p):
        return logits
    probs = logits.softmax(dim=-1)
    threshold = to_device(min_p, torch.float32, logits.device).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))
