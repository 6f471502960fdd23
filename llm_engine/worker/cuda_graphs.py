"""CUDA graphs of decode-only steps: one per batch size 1, 2, 4, ..., max_num_seqs.

All graphs read one static int32 input buffer, laid out per size as step_inputs.pack_step packs a
decode step (block tables `max_blocks` wide), and write one static hidden-state buffer; a step
replays the graph of the next size up, its padded rows writing no KV. The LM head runs after the
replay, on the sampled rows only. (Steps with prefill chunks: piecewise_graphs.py.)
"""
from __future__ import annotations

import bisect
from typing import Callable

import torch

from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.model.layers.attention import AttentionMetadata
from llm_engine.worker.step_inputs import SEGMENT_ALIGN, step_views


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    return sorted({min(1 << i, max_num_seqs) for i in range(max_num_seqs.bit_length() + 1)})


class DecodeGraphs:
    def __init__(self, model, max_num_seqs: int, max_blocks: int, block_size: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        """The static buffers, nothing captured yet (capture())."""
        self.model = model
        self.batch_sizes = graph_batch_sizes(max_num_seqs)
        self.max_blocks = max_blocks
        self.max_context = max_blocks * block_size
        self.device = device
        max_bs = self.batch_sizes[-1]
        # Per row: input id, position, slot, context length, block table; then the sampled rows and
        # the placeholders' positions and sampled rows; each of the eight segments padded to SEGMENT_ALIGN.
        self.inputs = torch.zeros(max_bs * (4 + max_blocks) + 3 * max_bs + 8 * SEGMENT_ALIGN, dtype=torch.int32,
                                  device=device)
        self.hidden = torch.empty(max_bs, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @torch.inference_mode()
    def capture(self):
        """Capture every size, largest first so the smaller graphs reuse its memory pool; the pool."""
        pool = None
        for bs in reversed(self.batch_sizes):
            body = self.body(bs)
            body()  # outside the graph first: Triton compiles (and autotunes) on first launch
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                body()
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        return pool

    def rows_for(self, batch: ScheduledBatch) -> int:
        """The graph size that replays the batch; 0 when none does (prefill chunks, too many
        sequences, a context past the graphs' block tables)."""
        if not (batch.is_decode_only and len(batch.seqs) <= self.batch_sizes[-1]
                and max(s.num_computed_tokens for s in batch.seqs) < self.max_context):
            return 0
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, len(batch.seqs))]

    def replay(self, rows: int) -> torch.Tensor:
        """The hidden states of the step uploaded into `inputs`."""
        self.graphs[rows].replay()
        return self.hidden[:rows]

    def body(self, bs: int) -> Callable[[], None]:
        """The decode forward of `bs` rows over the static buffers, as a graph records it."""
        inputs = step_views(self.inputs, [("input_ids", bs), ("positions", bs), ("slot_mapping", bs),
                                          ("context_lens", bs), ("block_tables", (bs, self.max_blocks))])
        # Placeholder rows for the warm-up launch (valid block 0, no KV written); replays overwrite them.
        self.inputs.zero_()
        inputs["slot_mapping"].fill_(-1)
        inputs["context_lens"].fill_(1)
        meta = AttentionMetadata(inputs["slot_mapping"], inputs["block_tables"], inputs["context_lens"], None)

        def run() -> None:
            self.hidden[:bs] = self.model(inputs["input_ids"], inputs["positions"], meta)

        return run
