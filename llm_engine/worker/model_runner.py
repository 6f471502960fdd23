"""Runs the model for one ScheduledBatch: step tensors in, logits of the sampled sequences out.

A step's inputs are packed into one int32 array and uploaded in one copy (step_inputs.py).
Attention: a decode-only batch (one new token per sequence) uses paged decode attention and, on
CUDA, replays a CUDA graph captured for the next bucketed batch size (cuda_graphs.py). A batch with
prefill chunks runs eagerly, or with `piecewise_graph_max_tokens` replays piecewise CUDA graphs for
the next token bucket with attention launched between them (piecewise_graphs.py); its leading
decodes still go through the decode kernel and only the chunks through paged prefill attention (a
1-token query would fill a whole prefill tile of BLOCK_M rows, and would re-read its KV for every
query head of a GQA group).

A step runs in three parts, so that tensor parallelism (tp_runner.py, tp_worker.py) can send it to
the other ranks between them: prepare_step (host side, rank 0 only), upload_step, run_step (every
rank). Start-up loads the model, sizes the KV pool from the memory a warm-up leaves free (kv_cache.py)
and captures the graphs.
"""
from __future__ import annotations

import numpy as np
import torch

from llm_engine.config import EngineConfig, check_fp8_support
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.kernels.fp8_gemm import warm_up_fp8_linear
from llm_engine.kernels.launch_config import launch_params, override_launch_params
from llm_engine.kernels.prefill_attention import MIN_BATCH_BUCKET
from llm_engine.model.layers.attention import AttentionMetadata
from llm_engine.model.loader import load_model
from llm_engine.model.tokenizer import Tokenizer
from llm_engine.worker.cuda_graphs import DecodeGraphs
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup
from llm_engine.worker.kv_cache import allocate_kv_cache, bytes_per_block, num_blocks_from_gpu_memory
from llm_engine.worker.piecewise_graphs import PiecewiseGraphs, bucket_sizes
from llm_engine.worker.prompt_logprobs import SLICE_ROWS, PromptLogprobs, score_prompt_rows
from llm_engine.worker.step_inputs import (
    StepLayout,
    leading_decodes,
    num_placeholders,
    pack_step,
    prompt_top,
    step_views,
)

# Decode graphs cover contexts up to this many tokens (vLLM's max_seq_len_to_capture): their block
# tables are that wide, and every replay copies and scans the full width. Longer contexts run
# eagerly, where attention time dwarfs the launch overhead a graph saves.
GRAPH_MAX_CONTEXT = 8192
# Context of the warm-up decode that takes the split-KV path.
SPLIT_WARMUP_CONTEXT = 2048


class ModelRunner:
    def __init__(self, config: EngineConfig, tp: TensorParallelGroup = SINGLE) -> None:
        """`tp`: this process's tensor-parallel rank; the runner holds and computes its shard."""
        self.config = config
        self.tp = tp
        self.model_config = config.model_config.per_rank(tp.size)  # this rank's heads: its KV pool
        self.device = config.torch_device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        check_fp8_support(config, self.device)
        torch.manual_seed(config.seed)
        self.block_size = config.block_size
        self.graph_max_blocks = -(-min(config.max_model_len, GRAPH_MAX_CONTEXT) // config.block_size)
        self.tokenizer = Tokenizer(self.model_config.path)
        self.model = load_model(config, tp)
        self.num_kv_blocks = tp.min(self._num_kv_blocks())  # one block table indexes every rank's pool
        self.kv_cache = allocate_kv_cache(self.model_config, self.num_kv_blocks, self.block_size,
                                          config.kv_cache_torch_dtype, self.device)
        self.kv_cache.bind(self.model.attention_layers)
        self.decode_graphs: DecodeGraphs | None = None
        self.piecewise: PiecewiseGraphs | None = None
        self.prompt_logprobs: PromptLogprobs | None = None  # the last step's scored prompt positions
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
        placeholder tokens stand for. The batch's prompt_rows are scored into prompt_logprobs."""
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
        replays a CUDA graph (unless it scores prompt positions: one-token prefill chunks)."""
        rows = self.decode_graphs.rows_for(batch) if graphs and self.decode_graphs and not batch.prompt_rows else 0
        if rows:
            host, sizes = pack_step(batch, self.block_size, self.config.max_model_len, num_rows=rows,
                                    width=self.decode_graphs.max_blocks, prefill=False)
            return host, StepLayout(sizes, host.size, graph_rows=rows, num_placeholders=num_placeholders(sizes))
        prefill = not batch.is_decode_only
        bucket = self.piecewise.bucket(batch.num_tokens) if graphs and self.piecewise else None
        host, sizes = pack_step(batch, self.block_size, self.config.max_model_len, num_rows=len(batch.seqs),
                                width=None, prefill=prefill, padded_tokens=bucket)
        return host, StepLayout(sizes, host.size, num_decodes=leading_decodes(batch.num_new_tokens) if prefill else 0,
                                num_placeholders=num_placeholders(sizes), piecewise_tokens=bucket or 0,
                                num_tokens=batch.num_tokens, prompt_top=prompt_top(batch))

    def upload_step(self, host: np.ndarray, layout: StepLayout,
                    sampled_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The packed inputs on the device, placeholders filled from `sampled_ids`; a graph reads
        them from fixed addresses: its static buffer."""
        if layout.graph_rows:
            flat = self.decode_graphs.inputs[: host.size].copy_(self._pinned(host), non_blocking=True)
        else:
            flat = self._upload(host)
        if layout.num_placeholders:
            if sampled_ids is None:
                raise ValueError(f"the step has {layout.num_placeholders} placeholder tokens but no sampled ids")
            views = step_views(flat, layout.sizes)
            views["input_ids"].index_put_((views["placeholder_dst"],), sampled_ids[views["placeholder_src"]])
        return flat

    def step_buffer(self, layout: StepLayout) -> torch.Tensor:
        """Where a tensor-parallel worker receives the packed inputs that rank 0 uploaded."""
        if layout.graph_rows:
            return self.decode_graphs.inputs[: layout.num_values]
        return torch.empty(layout.num_values, dtype=torch.int32, device=self.device)

    def run_step(self, flat: torch.Tensor, layout: StepLayout) -> torch.Tensor | None:
        """The forward pass over uploaded step inputs: execute()'s logits (None on tensor-parallel
        ranks other than 0), and prompt_logprobs."""
        inputs = step_views(flat, layout.sizes)
        if layout.graph_rows:
            hidden = self.decode_graphs.replay(layout.graph_rows)
        else:
            meta = AttentionMetadata(inputs["slot_mapping"], inputs["block_tables"], inputs["context_lens"],
                                     inputs.get("cu_seqlens_q"), layout.num_decodes)
            if layout.piecewise_tokens:
                hidden = self.piecewise.run((inputs["input_ids"], inputs["positions"], inputs["slot_mapping"]), meta,
                                            layout.num_tokens)
            else:
                hidden = self.model(inputs["input_ids"], inputs["positions"], meta)
        logits = self.model.compute_logits(hidden[inputs["logits_indices"]])
        self.prompt_logprobs = None if "prompt_rows" not in inputs else score_prompt_rows(
            self.model, hidden, inputs["prompt_rows"], inputs["prompt_targets"], layout.prompt_top,
            min(SLICE_ROWS, self.config.max_num_seqs))
        return logits

    def close(self) -> None:
        """Nothing to release on one rank; the tensor-parallel runner stops its workers here."""

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
        and multi-split paths, and the FP8 GEMM's row buckets. The largest prefill and the widest decode
        also profile peak memory.
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
        # Prefill batches of up to MIN_BATCH_BUCKET, then each doubling, share a variant; with FP8 KV and a
        # dequantize_min_tokens in the launch config, each also has its variant on a bf16 scratch cache.
        max_batch = min(cfg.max_num_seqs, budget // short)
        modes = [{}]
        if cfg.kv_cache_torch_dtype == torch.float8_e4m3fn and launch_params(
                "paged_prefill_attention", self.device, cfg.torch_dtype, cfg.kv_cache_torch_dtype
        )["dequantize_min_tokens"] is not None:
            modes = [{"dequantize_min_tokens": None}, {"dequantize_min_tokens": 0}]
        for mode in modes:
            with override_launch_params("paged_prefill_attention", **mode):
                self._dummy_run([(short, short)])
                batch = MIN_BATCH_BUCKET
                while batch < max_batch:
                    batch = min(2 * batch, max_batch)
                    self._dummy_run([(short, short)] * batch)
        # FP8 projections: each row bucket of the GEMM's launch config may have its own tiles.
        fp8 = [(m.weight, m.input_scale) for m in self.model.modules() if getattr(m, "weight_scale", None) is not None]
        if fp8:
            warm_up_fp8_linear(fp8, cfg.torch_dtype, budget)
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
        """The decode graphs, then (with piecewise_graph_max_tokens) the piecewise graphs in the same pool."""
        graphs = self.new_decode_graphs()
        pool = graphs.capture()
        self.decode_graphs = graphs
        if self.config.piecewise_graph_max_tokens:
            self.piecewise = self.piecewise_graphs(self.config.piecewise_graph_max_tokens)
            self.piecewise.capture(pool)
        torch.cuda.synchronize(self.device)

    def new_decode_graphs(self) -> DecodeGraphs:
        """Decode graphs' buffers for this runner's model and batch sizes, nothing captured."""
        return DecodeGraphs(self.model, self.config.max_num_seqs, self.graph_max_blocks, self.block_size,
                            self.model_config.hidden_size, self.config.torch_dtype, self.device)

    def piecewise_graphs(self, max_tokens: int) -> PiecewiseGraphs:
        """Piecewise graphs' buffers for steps of up to max_tokens tokens (capped at the step
        budget), nothing captured."""
        cfg = self.model_config
        return PiecewiseGraphs(self.model, bucket_sizes(min(max_tokens, self.config.max_num_batched_tokens)),
                               cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size, self.config.torch_dtype,
                               self.device)
