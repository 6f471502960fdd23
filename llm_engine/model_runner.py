"""Runs the model for one ScheduledBatch: step tensors in, logits of the sampled sequences out.

Each step's integer inputs (token ids, positions, cache slots, context lengths, query offsets,
block tables, the rows to sample) are built with numpy from flat per-sequence lists and packed into
one int32 array, so a step costs a single host-to-device copy. Each segment starts on a 16-byte
boundary: Triton specialises kernels on pointer alignment, so unaligned views would compile new
kernel variants whenever the batch size changed.

Attention: a decode-only batch (one new token per sequence) uses paged decode attention and, on
CUDA, replays a CUDA graph captured for the next bucketed batch size. A batch with prefill chunks
runs eagerly, or with `piecewise_graph_max_tokens` replays piecewise CUDA graphs for the next token
bucket with attention launched between them (piecewise_graphs.py); its leading decodes still go
through the decode kernel and only the chunks through paged prefill attention (a 1-token query
would fill a whole prefill tile of BLOCK_M rows, and would re-read its KV for every query head of
a GQA group).

A step runs in three parts, so that tensor parallelism (tp_runner.py, worker.py) can send it to the
other ranks between them: prepare_step (host side, rank 0 only), upload_step, run_step (every rank).

Async scheduling: a step can be launched before the previous one's sampled ids reach the host. Its
sequences then end in placeholder tokens (sequence.placeholder_token); prepare_step lists where they
sit in the input ids and which sampled row each stands for, and upload_step copies those rows from
the previous step's sampled-id tensor into the uploaded input ids, on the device, in stream order
(for a graph: into its static input buffer, before the replay; with tensor parallelism: before the
broadcast, so the other ranks receive the real ids).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from llm_engine.batch import ScheduledBatch
from llm_engine.config import EngineConfig
from llm_engine.distributed import SINGLE, TensorParallelGroup
from llm_engine.kernels.prefill_attention import MIN_BATCH_BUCKET
from llm_engine.kv_cache import allocate_kv_cache, bytes_per_block, num_blocks_from_gpu_memory
from llm_engine.layers.attention import AttentionMetadata
from llm_engine.loader import load_model
from llm_engine.piecewise_graphs import PiecewiseGraphs, bucket_sizes
from llm_engine.sequence import Sequence, placeholder_row
from llm_engine.tokenizer import Tokenizer

# Decode graphs cover contexts up to this many tokens (vLLM's max_seq_len_to_capture): their block
# tables are that wide, and every replay copies and scans the full width. Longer contexts run
# eagerly, where attention time dwarfs the launch overhead a graph saves.
GRAPH_MAX_CONTEXT = 8192
# int32 elements per 16 bytes: every packed step-input segment starts on this boundary.
SEGMENT_ALIGN = 4
# Context of the warm-up decode that takes the split-KV path.
SPLIT_WARMUP_CONTEXT = 2048


@dataclass
class StepLayout:
    """How a step's packed int32 inputs are laid out and run: what the other tensor-parallel
    ranks receive (as JSON) besides the packed array."""

    sizes: list[tuple[str, int | tuple[int, int]]]  # the segments (_views)
    num_values: int                                 # the packed array's length
    graph_rows: int = 0                             # the CUDA graph that replays the step; 0: eager
    num_decodes: int = 0                            # leading decodes of a step with prefill chunks
    num_placeholders: int = 0                       # input ids filled from the previous step's sampled ids
    piecewise_tokens: int = 0                       # the piecewise graphs' bucket (tokens padded to it); 0: none
    num_tokens: int = 0                             # the step's real tokens (of a piecewise step)


class ModelRunner:
    def __init__(self, config: EngineConfig, tp: TensorParallelGroup = SINGLE) -> None:
        """`tp`: this process's tensor-parallel rank; the runner holds and computes its shard."""
        self.config = config
        self.tp = tp
        self.model_config = config.model_config.per_rank(tp.size)  # this rank's heads: its KV pool
        self.device = config.torch_device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.manual_seed(config.seed)
        self.block_size = config.block_size
        self.graph_max_blocks = -(-min(config.max_model_len, GRAPH_MAX_CONTEXT) // config.block_size)
        self.tokenizer = Tokenizer(self.model_config.path)
        self.model = load_model(config, tp)
        self.num_kv_blocks = tp.min(self._num_kv_blocks())  # one block table indexes every rank's pool
        self.kv_cache = allocate_kv_cache(self.model_config, self.num_kv_blocks, self.block_size,
                                          config.kv_cache_torch_dtype, self.device)
        self.kv_cache.bind(self.model.attention_layers)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_batch_sizes: list[int] = []
        self.piecewise: PiecewiseGraphs | None = None
        if config.use_cuda_graphs:
            self.capture_cudagraphs()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.tokenizer.eos_token_ids

    # --- one step -------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, sampled_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Write the batch's KV and return float32 logits [num_sampled, vocab], in batch order.
        `sampled_ids`: the previous step's sampled ids (on the device), which the batch's
        placeholder tokens stand for."""
        if not batch.seqs:
            return torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        host, layout = self.prepare_step(batch, graphs=True)
        return self.run_step(self.upload_step(host, layout, sampled_ids), layout)

    @torch.inference_mode()
    def execute_eager(self, batch: ScheduledBatch) -> torch.Tensor:
        """execute() without CUDA graphs."""
        host, layout = self.prepare_step(batch, graphs=False)
        return self.run_step(self.upload_step(host, layout), layout)

    def prepare_step(self, batch: ScheduledBatch, graphs: bool) -> tuple[np.ndarray, StepLayout]:
        """The step's packed inputs and their layout; with `graphs`, a decode batch that fits one
        replays a CUDA graph."""
        if graphs and self.graphs and self._fits_graph(batch):
            rows = self.graph_batch_sizes[bisect.bisect_left(self.graph_batch_sizes, len(batch.seqs))]
            host, sizes = self._prepare(batch, num_rows=rows, width=self.graph_max_blocks, prefill=False)
            return host, StepLayout(sizes, host.size, graph_rows=rows, num_placeholders=_num_placeholders(sizes))
        prefill = not batch.is_decode_only
        bucket = self.piecewise.bucket(batch.num_tokens) if graphs and self.piecewise else None
        host, sizes = self._prepare(batch, num_rows=len(batch.seqs), width=None, prefill=prefill,
                                    padded_tokens=bucket)
        return host, StepLayout(sizes, host.size, num_decodes=_leading_decodes(batch.num_new_tokens) if prefill else 0,
                                num_placeholders=_num_placeholders(sizes), piecewise_tokens=bucket or 0,
                                num_tokens=batch.num_tokens)

    def upload_step(self, host: np.ndarray, layout: StepLayout,
                    sampled_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The packed inputs on the device, placeholders filled from `sampled_ids`; a graph reads
        them from fixed addresses: its static buffer."""
        if layout.graph_rows:
            flat = self._graph_inputs[: host.size].copy_(self._pinned(host), non_blocking=True)
        else:
            flat = self._upload(host)
        if layout.num_placeholders:
            if sampled_ids is None:
                raise ValueError(f"the step has {layout.num_placeholders} placeholder tokens but no sampled ids")
            views = self._views(flat, layout.sizes)
            views["input_ids"].index_put_((views["placeholder_dst"],), sampled_ids[views["placeholder_src"]])
        return flat

    def step_buffer(self, layout: StepLayout) -> torch.Tensor:
        """Where a tensor-parallel worker receives the packed inputs that rank 0 uploaded."""
        if layout.graph_rows:
            return self._graph_inputs[: layout.num_values]
        return torch.empty(layout.num_values, dtype=torch.int32, device=self.device)

    def run_step(self, flat: torch.Tensor, layout: StepLayout) -> torch.Tensor | None:
        """The forward pass over uploaded step inputs: execute()'s logits (None on tensor-parallel
        ranks other than 0)."""
        inputs = self._views(flat, layout.sizes)
        if layout.graph_rows:
            self.graphs[layout.graph_rows].replay()
            hidden = self._graph_hidden[: layout.graph_rows]
        else:
            meta = AttentionMetadata(inputs["slot_mapping"], inputs["block_tables"], inputs["context_lens"],
                                     inputs.get("cu_seqlens_q"), layout.num_decodes)
            if layout.piecewise_tokens:
                hidden = self.piecewise.run((inputs["input_ids"], inputs["positions"], inputs["slot_mapping"]), meta,
                                            layout.num_tokens)
            else:
                hidden = self.model(inputs["input_ids"], inputs["positions"], meta)
        return self.model.compute_logits(hidden[inputs["logits_indices"]])

    def _fits_graph(self, batch: ScheduledBatch) -> bool:
        max_context = self.graph_max_blocks * self.block_size
        return (batch.is_decode_only and len(batch.seqs) <= self.graph_batch_sizes[-1]
                and max(s.num_computed_tokens for s in batch.seqs) < max_context)

    def close(self) -> None:
        """Nothing to release on one rank; the tensor-parallel runner stops its workers here."""

    def _prepare(self, batch: ScheduledBatch, num_rows: int, width: int | None, prefill: bool,
                 padded_tokens: int | None = None) -> tuple[np.ndarray, list[tuple[str, int | tuple[int, int]]]]:
        """The step's packed int32 inputs and their segment sizes.

        num_rows >= len(batch.seqs) pads a decode batch to a graph size (padded rows write no KV
        and attend over one cached token); width fixes the block-table width (None: the batch's);
        padded_tokens pads the token ids, positions and slots to a piecewise graph's bucket.
        """
        seqs, bs = batch.seqs, self.block_size
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
        if max_context > self.config.max_model_len:
            raise ValueError(f"a sequence reaches {max_context} tokens; max_model_len is {self.config.max_model_len}")
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
            d = _leading_decodes(batch.num_new_tokens)
            segments.append(("cu_seqlens_q", cu_seqlens[d:] - d))
        segments += [("block_tables", block_tables.ravel()), ("logits_indices", logits_indices)]
        if placeholders.size:
            segments += [("placeholder_dst", placeholders), ("placeholder_src", placeholder_row(input_ids[placeholders]))]
        sizes = [(name, (num_rows, width) if name == "block_tables" else a.size) for name, a in segments]
        # (np.pad and concatenate would cost more than the rest of the step preparation together.)
        starts = np.cumsum([0] + [-(-a.size // SEGMENT_ALIGN) * SEGMENT_ALIGN for _, a in segments])
        packed = np.zeros(int(starts[-1]), dtype=np.int32)
        for (_, a), start in zip(segments, starts.tolist()):
            packed[start:start + a.size] = a
        return packed, sizes

    @staticmethod
    def _views(flat: torch.Tensor, sizes: list[tuple[str, int | tuple[int, int]]]) -> dict[str, torch.Tensor]:
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

    def _pinned(self, host: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(host)
        return t.pin_memory() if self.device.type == "cuda" else t

    def _upload(self, host: np.ndarray) -> torch.Tensor:
        return self._pinned(host).to(self.device, non_blocking=True)

    # --- start-up -------------------------------------------------------------------------------

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        if self.device.type != "cuda":
            return self.config.cpu_kv_cache_tokens // self.block_size
        torch.cuda.reset_peak_memory_stats(self.device)
        # Profile the largest steps the scheduler can issue: their activations must fit next to the pool.
        self.warmup()
        block_bytes = bytes_per_block(self.model_config, self.block_size, self.config.kv_cache_torch_dtype)
        piecewise = self.config.use_cuda_graphs and self.config.piecewise_graph_max_tokens > 0
        return num_blocks_from_gpu_memory(self.device, self.config.gpu_memory_utilization, block_bytes,
                                          activation_copies=2 if piecewise else 1)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Steps that compile every kernel variant the scheduler's batches can need, before serving.

        Step shapes only change integer arguments and grids, which the kernels do not specialise
        on; what remains are the prefill kernel's batch buckets and the decode kernel's single-
        and multi-split paths. The largest prefill and the widest decode also profile peak memory.
        """
        cfg = self.config
        max_len, budget = cfg.max_model_len, cfg.max_num_batched_tokens
        full, rest = divmod(budget, max_len)
        largest = ([max_len] * full + ([rest] if rest else []))[: cfg.max_num_seqs]
        self._dummy_run([(n, n) for n in largest])
        short = min(2, max_len)
        self._dummy_run([(short, 1)] * min(cfg.max_num_seqs, budget))
        if self.device.type != "cuda":
            return  # the CPU runs the torch references: nothing to compile
        # One sequence with a long context: the decode kernel splits it. One row, then two: the fused
        # small-batch projections' single-row and multi-row variants, where the launch config enables them.
        self._dummy_run([(min(max_len, SPLIT_WARMUP_CONTEXT), 1)])
        self._dummy_run([(short, 1)] * min(2, cfg.max_num_seqs))
        # Prefill batches of up to MIN_BATCH_BUCKET, then each doubling, share a variant.
        max_batch, batch = min(cfg.max_num_seqs, budget // short), MIN_BATCH_BUCKET
        while batch < max_batch:
            batch = min(2 * batch, max_batch)
            self._dummy_run([(short, short)] * batch)
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def _dummy_run(self, lengths: list[tuple[int, int]]) -> None:
        """One eager step of placeholder sequences, (context length, new tokens) each, over a
        scratch KV pool, so no cached block is touched."""
        seqs, next_block = [], 0
        for length, n in lengths:
            seq = Sequence(token_ids=[0] * length, sampling_params=None, num_computed_tokens=length - n)
            num_blocks = -(-length // self.block_size)
            seq.block_table = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            seqs.append(seq)
        scratch = allocate_kv_cache(self.model_config, next_block, self.block_size,
                                    self.config.kv_cache_torch_dtype, self.device)
        layers = self.model.attention_layers
        bound = [(a.k_cache, a.v_cache, a.k_scale, a.v_scale) for a in layers]
        scratch.bind(layers)
        try:
            new = [n for _, n in lengths]
            self.execute_eager(ScheduledBatch(seqs=seqs, num_new_tokens=new, sample=[True] * len(seqs)))
        finally:
            for attn, caches in zip(layers, bound):
                attn.bind_kv_cache(*caches)

    @torch.inference_mode()
    def capture_cudagraphs(self) -> None:
        """One graph per batch size 1, 2, 4, ..., max_num_seqs for decode-only steps.

        All graphs read one static int32 input buffer, laid out per size as _prepare packs a
        decode step (block tables graph_max_blocks wide), and write one static hidden-state buffer.
        The LM head runs after the replay, on the sampled rows only.
        """
        max_bs = self.config.max_num_seqs
        sizes = sorted({min(1 << i, max_bs) for i in range(max_bs.bit_length() + 1)})
        self._allocate_graph_buffers(max_bs)
        pool = None
        for bs in reversed(sizes):  # largest first: the smaller graphs reuse its memory pool
            body = self._graph_body(bs)
            body()  # outside the graph first: Triton compiles (and autotunes) on first launch
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                body()
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        self.graph_batch_sizes = sizes
        if self.config.piecewise_graph_max_tokens:
            self.piecewise = self.piecewise_graphs(self.config.piecewise_graph_max_tokens)
            self.piecewise.capture(pool)
        torch.cuda.synchronize(self.device)

    def piecewise_graphs(self, max_tokens: int) -> PiecewiseGraphs:
        """Piecewise graphs' buffers for steps of up to max_tokens tokens (capped at the step
        budget), nothing captured."""
        cfg = self.model_config
        return PiecewiseGraphs(self.model, bucket_sizes(min(max_tokens, self.config.max_num_batched_tokens)),
                               cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size, self.config.torch_dtype,
                               self.device)

    def _allocate_graph_buffers(self, max_bs: int) -> None:
        # Per row: input id, position, slot, context length, block table; then the sampled rows and
        # the placeholders' positions and sampled rows; each of the eight segments padded to SEGMENT_ALIGN.
        size = max_bs * (4 + self.graph_max_blocks) + 3 * max_bs + 8 * SEGMENT_ALIGN
        self._graph_inputs = torch.zeros(size, dtype=torch.int32, device=self.device)
        self._graph_hidden = torch.empty(max_bs, self.model_config.hidden_size, dtype=self.config.torch_dtype,
                                         device=self.device)

    def _graph_body(self, bs: int):
        """The decode forward of `bs` rows over the static buffers, as a graph records it."""
        inputs = self._views(self._graph_inputs, [("input_ids", bs), ("positions", bs), ("slot_mapping", bs),
                                                  ("context_lens", bs), ("block_tables", (bs, self.graph_max_blocks))])
        # Placeholder rows for the warm-up launch (valid block 0, no KV written); replays overwrite them.
        self._graph_inputs.zero_()
        inputs["slot_mapping"].fill_(-1)
        inputs["context_lens"].fill_(1)
        meta = AttentionMetadata(inputs["slot_mapping"], inputs["block_tables"], inputs["context_lens"], None)

        def body() -> None:
            self._graph_hidden[:bs] = self.model(inputs["input_ids"], inputs["positions"], meta)

        return body


def _padded(a: np.ndarray, n: int, value: int) -> np.ndarray:
    out = np.full(n, value, dtype=a.dtype)
    out[:a.size] = a
    return out


def _num_placeholders(sizes: list[tuple[str, int | tuple[int, int]]]) -> int:
    return dict(sizes).get("placeholder_dst", 0)


def _leading_decodes(num_new_tokens: list[int]) -> int:
    """How many sequences at the front of a step with prefill chunks have one new token
    (the scheduler puts decodes first)."""
    for i, n in enumerate(num_new_tokens):
        if n != 1:
            return i
    return len(num_new_tokens)
