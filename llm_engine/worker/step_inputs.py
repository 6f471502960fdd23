"""A step's integer inputs packed into one int32 array, so a step costs a single host-to-device copy.

The segments (token ids, positions, cache slots, context lengths, the prefill chunks' query offsets,
block tables, the rows to sample, the placeholders of async scheduling, and the prompt positions to
score with the tokens they score) are built with numpy from
flat per-sequence lists. Each starts on a 16-byte boundary: Triton specialises kernels on pointer
alignment, so unaligned views would compile new kernel variants whenever the batch size changed.

Async scheduling: a sequence of a step launched before the previous step's sampled ids reached the
host ends in a placeholder token (core/sequence.placeholder_token); the packed inputs list where the
placeholders sit in the input ids and which sampled row each stands for, and the runner fills them in
on the device (model_runner.upload_step).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import placeholder_row

# int32 elements per 16 bytes: every packed step-input segment starts on this boundary.
SEGMENT_ALIGN = 4

Sizes = list[tuple[str, int | tuple[int, int]]]


@dataclass
class StepLayout:
    """How a step's packed int32 inputs are laid out and run: what the other tensor-parallel
    ranks receive (as JSON) besides the packed array."""

    sizes: Sizes                                    # the segments (step_views)
    num_values: int                                 # the packed array's length
    graph_rows: int = 0                             # the CUDA graph that replays the step; 0: eager
    num_decodes: int = 0                            # leading decodes of a step with prefill chunks
    num_placeholders: int = 0                       # input ids filled from the previous step's sampled ids
    piecewise_tokens: int = 0                       # the piecewise graphs' bucket (tokens padded to it); 0: none
    num_tokens: int = 0                             # the step's real tokens (of a piecewise step)
    prompt_top: int = 0                             # most likely tokens reported at each scored prompt position


def pack_step(batch: ScheduledBatch, block_size: int, max_model_len: int, num_rows: int, width: int | None,
              prefill: bool, padded_tokens: int | None = None) -> tuple[np.ndarray, Sizes]:
    """The step's packed int32 inputs and their segment sizes.

    num_rows >= len(batch.seqs) pads a decode batch to a graph size (padded rows write no KV
    and attend over one cached token); width fixes the block-table width (None: the batch's);
    padded_tokens pads the token ids, positions and slots to a piecewise graph's bucket.
    """
    seqs, bs = batch.seqs, block_size
    num_seqs = len(seqs)
    new = np.asarray(batch.num_new_tokens, dtype=np.int64)
    start, seq_lens, table_lens = np.array(
        [(s.num_computed_tokens, len(s), len(s.block_table)) for s in seqs], dtype=np.int64).T
    context_lens = start + new
    if (context_lens > seq_lens).any():
        i = int(np.argmax(context_lens > seq_lens))
        raise ValueError(f"sequence {seqs[i].seq_id} is scheduled up to token {context_lens[i]} "
                         f"but has {seq_lens[i]} tokens")
    max_context = int(context_lens.max())
    if max_context > max_model_len:
        raise ValueError(f"a sequence reaches {max_context} tokens; max_model_len is {max_model_len}")
    num_blocks = -(-context_lens // bs)
    if (table_lens < num_blocks).any():
        i = int(np.argmax(table_lens < num_blocks))
        raise ValueError(f"sequence {seqs[i].seq_id} has {table_lens[i]} KV blocks for {context_lens[i]} tokens")
    width = int(num_blocks.max()) if width is None else width

    cu_seqlens = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(new, out=cu_seqlens[1:])
    num_tokens = int(cu_seqlens[-1])
    seq_of_token = np.repeat(np.arange(num_seqs), new)
    positions = np.arange(num_tokens) + np.repeat(start - cu_seqlens[:-1], new)
    input_ids = np.fromiter(
        chain.from_iterable(s.token_ids[a:a + n] for s, a, n in zip(seqs, start.tolist(), batch.num_new_tokens)),
        dtype=np.int64, count=num_tokens)
    placeholders = np.flatnonzero(input_ids < 0)  # left negative: an unfilled one fails the lookup
    block_tables = np.zeros((num_rows, width), dtype=np.int64)
    block_tables[:num_seqs][np.arange(width) < num_blocks[:, None]] = np.fromiter(
        chain.from_iterable(s.block_table[:k] for s, k in zip(seqs, num_blocks.tolist())),
        dtype=np.int64, count=int(num_blocks.sum()))
    slot_mapping = block_tables[seq_of_token, positions // bs] * bs + positions % bs
    logits_indices = (cu_seqlens[1:] - 1)[np.asarray(batch.sample, dtype=bool)]

    # Padding tokens (a decode graph's rows, one token each, or a piecewise bucket): token 0 at
    # position 0, no KV written.
    tokens_to = padded_tokens or max(num_rows, num_tokens)
    if tokens_to > num_tokens:
        input_ids, positions = _padded(input_ids, tokens_to, 0), _padded(positions, tokens_to, 0)
        slot_mapping = _padded(slot_mapping, tokens_to, -1)
    if num_rows > num_seqs:
        context_lens = _padded(context_lens, num_rows, 1)
    segments = [("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping),
                ("context_lens", context_lens)]
    if prefill:  # the prefill sequences' offsets, from their first token (see AttentionMetadata)
        d = leading_decodes(batch.num_new_tokens)
        segments.append(("cu_seqlens_q", cu_seqlens[d:] - d))
    segments += [("block_tables", block_tables.ravel()), ("logits_indices", logits_indices)]
    if placeholders.size:
        segments += [("placeholder_dst", placeholders), ("placeholder_src", placeholder_row(input_ids[placeholders]))]
    if batch.prompt_rows:
        segments += _prompt_segments(batch, cu_seqlens, start)
    sizes = [(name, (num_rows, width) if name == "block_tables" else a.size) for name, a in segments]
    # (np.pad and concatenate would cost more than the rest of the step preparation together.)
    starts = np.cumsum([0] + [-(-a.size // SEGMENT_ALIGN) * SEGMENT_ALIGN for _, a in segments])
    packed = np.zeros(int(starts[-1]), dtype=np.int32)
    for (_, a), start in zip(segments, starts.tolist()):
        packed[start:start + a.size] = a
    return packed, sizes


def _prompt_segments(batch: ScheduledBatch, cu_seqlens: np.ndarray,
                     start: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The token rows of the prompt positions to score, and the prompt tokens they score (the next ones)."""
    scored = batch.prompt_rows
    rows = np.concatenate([np.arange(count) + (cu_seqlens[i] + first - start[i]) for i, first, count in scored])
    targets = np.fromiter(chain.from_iterable(batch.seqs[i].token_ids[first + 1:first + 1 + count]
                                              for i, first, count in scored), dtype=np.int64, count=rows.size)
    return [("prompt_rows", rows), ("prompt_targets", targets)]


def prompt_top(batch: ScheduledBatch) -> int:
    """The most likely tokens to report at the step's scored prompt positions (the largest ask)."""
    return max((batch.seqs[i].sampling_params.prompt_logprobs for i, _, _ in batch.prompt_rows), default=0)


def step_views(flat: torch.Tensor, sizes: Sizes) -> dict[str, torch.Tensor]:
    """The named segments of packed step inputs (on the host or the device)."""
    views, offset = {}, 0
    for name, size in sizes:
        if isinstance(size, tuple):
            rows, width = size
            views[name] = flat[offset:offset + rows * width].view(rows, width)
            offset += rows * width
        else:
            views[name] = flat[offset:offset + size]
            offset += size
        offset += -offset % SEGMENT_ALIGN
    return views


def num_placeholders(sizes: Sizes) -> int:
    return dict(sizes).get("placeholder_dst", 0)


def leading_decodes(num_new_tokens: list[int]) -> int:
    """How many sequences at the front of a step with prefill chunks have one new token
    (the scheduler puts decodes first)."""
    for i, n in enumerate(num_new_tokens):
        if n != 1:
            return i
    return len(num_new_tokens)


def _padded(a: np.ndarray, n: int, value: int) -> np.ndarray:
    out = np.full(n, value, dtype=a.dtype)
    out[:a.size] = a
    return out
