"""Rank 0's handle on its tensor-parallel workers: start them, notice when one fails, stop them.

Each worker is a `python -m llm_engine.worker.tp_worker` child (child_process.py): its stdin carries the start
message and then stays open, so rank 0's death closes it and the worker exits (no orphans, even
after SIGKILL); its stderr is relayed with a `[tp rank r]` prefix to rank 0's stderr, and the last
lines are kept for the error rank 0 raises when the worker fails.
"""
from __future__ import annotations

import logging
import subprocess
import time

import torch.distributed as dist

from llm_engine.child_process import ChildProcess
from llm_engine.config import EngineConfig
from llm_engine.errors import WorkerError
from llm_engine.worker.distributed import TensorParallelGroup, destroy_group, init_group, rank_device

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"      # every rank runs on this host
EXIT_GRACE_S = 1.0      # for a failing worker to finish exiting once rank 0 saw its step fail
STOP_TIMEOUT_S = 10.0


class WorkerGroup:
    def __init__(self, config: EngineConfig) -> None:
        """Start ranks 1 .. size-1 and join rank 0 (this process) to their process group."""
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group exists already: one tensor-parallel "
                               "engine per process")
        size = config.tensor_parallel_size
        device = config.torch_device
        rank_device(device, size - 1)  # enough GPUs, checked before anything starts
        self.store = dist.TCPStore(HOST, 0, size, is_master=True, wait_for_workers=False)
        self.workers: list[ChildProcess] = []
        self._stopped = False
        try:
            for rank in range(1, size):
                self._start(config, rank, size)
            self._wait_until_started(size)
            self.tp: TensorParallelGroup = init_group(self.store, 0, size, device)
        except BaseException:
            self.kill()
            raise

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [worker.proc for worker in self.workers]

    def _start(self, config: EngineConfig, rank: int, size: int) -> None:
        start = {"config": config, "rank": rank, "size": size, "host": HOST, "port": self.store.port}
        self.workers.append(ChildProcess("llm_engine.worker.tp_worker", start, f"tp rank {rank}"))

    def _wait_until_started(self, size: int) -> None:
        """Every worker imported the engine and reached the rendezvous (a failure so far would
        otherwise leave rank 0 waiting in it)."""
        keys = [f"started/{rank}" for rank in range(1, size)]
        while not self.store.check(keys):
            if self.any_exited():
                raise self.failure("a tensor-parallel worker failed to start")
            time.sleep(0.05)

    def any_exited(self) -> bool:
        return any(worker.exited() for worker in self.workers)

    def failure(self, reason: str) -> WorkerError | None:
        """After a failure: stop every worker and return the error naming those that exited on
        their own, with their last output (None if none did)."""
        deadline = time.monotonic() + EXIT_GRACE_S
        for worker in self.workers:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        exited = [(rank, worker) for rank, worker in enumerate(self.workers, 1) if worker.exited()]
        self.kill()
        failed = [f"rank {rank} exited with code {worker.returncode}; its last output:\n{worker.last_output()}"
                  for rank, worker in exited]
        return WorkerError("\n".join([reason, *failed])) if failed else None

    def stop(self) -> None:
        """Tell the workers to leave their loop and leave the group with them (every rank at once: NCCL's
        destroy on rank 0 alone, after the others exited, never returned), wait for them to exit, kill
        any that did not within STOP_TIMEOUT_S."""
        if self._stopped:
            return
        try:
            self.tp.send_command("stop")
        except RuntimeError:  # a worker is gone: nothing to wait for, the rest are killed below
            pass
        else:
            deadline = time.monotonic() + STOP_TIMEOUT_S
            self._leave_group(STOP_TIMEOUT_S)
            for worker in self.workers:
                worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """Kill whatever worker still runs and release the group (idempotent), within STOP_TIMEOUT_S."""
        if self._stopped:
            return
        self._stopped = True
        for worker in self.workers:
            worker.kill()
        self._leave_group(STOP_TIMEOUT_S)
        self.store = None

    def _leave_group(self, timeout_s: float) -> None:
        if not destroy_group(timeout_s):
            logger.warning("rank 0 did not leave the tensor-parallel group within %.0f s; its workers are "
                           "killed and this process cannot start another group", timeout_s)

