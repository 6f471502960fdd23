"""Tensor parallelism's rank 0: the runner the engine drives when tensor_parallel_size > 1.

It wraps rank 0's ModelRunner, which holds its shard of the model like every rank (the engine around
it holds the scheduler, the sampler and the tokenizer). Each step it prepares the packed step inputs
as a single runner does, broadcasts their layout (a JSON command) and then the packed array itself,
and runs its forward pass; the workers (tp_worker.py) run theirs on the same inputs in lockstep. The
row-parallel layers' all-reduces keep every rank's hidden states equal; the logits are gathered on
rank 0 only.

Start-up (weights, KV pool sizing, CUDA graphs) runs the same on every rank without any command;
after it, warm-ups and steps are broadcast. A step that fails once sent leaves the ranks out of
step: the workers are stopped, and that step and every later one raise WorkerError.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import asdict

import torch

from llm_engine.config import EngineConfig, check_fp8_support
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.errors import WorkerError
from llm_engine.worker.model_runner import ModelRunner
from llm_engine.worker.worker_group import WorkerGroup


def create_model_runner(config: EngineConfig) -> ModelRunner | TensorParallelRunner:
    return TensorParallelRunner(config) if config.tensor_parallel_size > 1 else ModelRunner(config)


class TensorParallelRunner:
    def __init__(self, config: EngineConfig) -> None:
        check_fp8_support(config, config.torch_device)   # plainly, before the workers start (each rank checks too)
        self.workers = WorkerGroup(config)
        self._kill_workers = weakref.finalize(self, self.workers.kill)  # also at interpreter exit
        self._failure: WorkerError | None = None
        try:
            self.runner = ModelRunner(config, self.workers.tp)
        except BaseException as exc:
            error = self.workers.failure("tensor-parallel start-up failed")
            self._kill_workers()
            if error is None:
                raise
            raise error from exc
        self.tp = self.workers.tp
        self.tokenizer = self.runner.tokenizer
        self.num_kv_blocks = self.runner.num_kv_blocks

    @property
    def prompt_logprobs(self):
        """The last step's scored prompt positions (rank 0's, ModelRunner.prompt_logprobs)."""
        return self.runner.prompt_logprobs

    @property
    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self.workers.procs]

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, sampled_ids: torch.Tensor | None = None) -> torch.Tensor:
        if not batch.seqs:
            return self.runner.execute(batch)
        runner = self.runner
        host, layout = runner.prepare_step(batch, graphs=True)  # a bad step raises here, before any rank sees it
        with self._on_every_rank():
            self.tp.send_command("step", **asdict(layout))
            # Placeholders are filled on rank 0's device before the broadcast (stream-ordered with NCCL).
            return runner.run_step(self.tp.broadcast(runner.upload_step(host, layout, sampled_ids)), layout)

    @torch.inference_mode()
    def warmup(self) -> None:
        with self._on_every_rank():
            self.tp.send_command("warmup")
            self.runner.warmup()

    @contextlib.contextmanager
    def _on_every_rank(self):
        if self._failure is None and self.workers.any_exited():
            self._failure = self.workers.failure("a tensor-parallel worker exited")
        if self._failure is not None:
            raise WorkerError(f"the tensor-parallel workers are stopped: {self._failure}")
        try:
            yield
        except BaseException as exc:
            self._failure = (self.workers.failure(f"tensor-parallel step failed ({exc!r})")
                             or WorkerError(f"tensor-parallel step failed on rank 0 ({exc!r})"))
            raise self._failure from exc

    def close(self) -> None:
        """Stop the workers (the engine is unusable afterwards); idempotent."""
        if self._failure is None:
            self._failure = WorkerError("the runner was closed")
            self.workers.stop()
        self._kill_workers()
