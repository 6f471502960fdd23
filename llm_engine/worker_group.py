"""Rank 0's handle on its tensor-parallel workers: start them, notice when one fails, stop them.

Each worker is a `python -m llm_engine.worker` child. Its stdin carries the start message and then
stays open: rank 0's death closes it and the worker exits (no orphans, even after SIGKILL). Its
stderr is relayed, line by line with a rank prefix, to rank 0's stderr, and the last lines are kept
for the error rank 0 raises when the worker fails.
"""
from __future__ import annotations

import collections
import pickle
import subprocess
import sys
import threading
import time

import torch.distributed as dist

from llm_engine.config import EngineConfig
from llm_engine.distributed import TensorParallelGroup, destroy_group, init_group, rank_device

HOST = "127.0.0.1"      # every rank runs on this host
TAIL_LINES = 40         # of a failed worker's output, quoted in the error
EXIT_GRACE_S = 1.0      # for a failing worker to finish exiting once rank 0 saw its step fail
STOP_TIMEOUT_S = 10.0


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or exited; the message quotes its last output."""


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
        self.procs: list[subprocess.Popen] = []
        self.tails: list[collections.deque] = []
        self._relays: list[threading.Thread] = []
        self._stopped = False
        try:
            for rank in range(1, size):
                self._start(config, rank, size)
            self._wait_until_started(size)
            self.tp: TensorParallelGroup = init_group(self.store, 0, size, device)
        except BaseException:
            self.kill()
            raise

    def _start(self, config: EngineConfig, rank: int, size: int) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "llm_engine.worker"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.append(proc)
        tail = collections.deque(maxlen=TAIL_LINES)
        self.tails.append(tail)
        relay = threading.Thread(target=_relay, args=(proc.stderr, rank, tail), name=f"tp-rank{rank}-stderr",
                                 daemon=True)
        relay.start()
        self._relays.append(relay)
        pickle.dump({"config": config, "rank": rank, "size": size, "host": HOST, "port": self.store.port},
                    proc.stdin)
        proc.stdin.flush()

    def _wait_until_started(self, size: int) -> None:
        """Every worker imported the engine and reached the rendezvous (a failure so far would
        otherwise leave rank 0 waiting in it)."""
        keys = [f"started/{rank}" for rank in range(1, size)]
        while not self.store.check(keys):
            if self.any_exited():
                raise self.failure("a tensor-parallel worker failed to start")
            time.sleep(0.05)

    def any_exited(self) -> bool:
        return any(proc.poll() is not None for proc in self.procs)

    def failure(self, reason: str) -> WorkerError | None:
        """After a failure: stop every worker and return the error naming those that exited on
        their own, with their last output (None if none did)."""
        deadline = time.monotonic() + EXIT_GRACE_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        codes = [proc.poll() for proc in self.procs]
        self.kill()
        failed = [f"rank {rank} exited with code {code}; its last output:\n{''.join(tail) or '(none)'}"
                  for rank, (code, tail) in enumerate(zip(codes, self.tails), 1) if code is not None]
        return WorkerError("\n".join([reason, *failed])) if failed else None

    def stop(self) -> None:
        """Tell the workers to leave their loop, wait for them to exit, release the group."""
        if self._stopped:
            return
        try:
            self.tp.send_command("stop")
        except RuntimeError:  # a worker is gone: nothing to wait for, the rest are killed below
            pass
        else:
            for proc in self.procs:
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        self.kill()

    def kill(self) -> None:
        """Kill whatever worker still runs and release the group (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdin.close()
        for relay in self._relays:
            relay.join(timeout=5)
        destroy_group()
        self.store = None


def _relay(stream, rank: int, tail: collections.deque) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        tail.append(line)
        sys.stderr.write(f"[tp rank {rank}] {line}")
    stream.close()
