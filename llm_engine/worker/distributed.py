"""Tensor parallelism's communication: this process's rank, the collectives the sharded layers
need, and the commands rank 0 broadcasts to the other ranks each step.

The group is torch.distributed's default one (one engine per process): NCCL between GPUs, gloo
between CPU processes. At size 1 no collective runs: the layers check `size` first.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from llm_engine.worker.host_copy import to_device

# A command is JSON in a fixed-size byte tensor, so the other ranks know what to receive.
HEADER_BYTES = 1024
# NVLink multicast stays off (NCCL, PyTorch symmetric memory, NVSHMEM): on a shared host a program
# using it can put the GPUs out of service for everyone. A variable set already is kept.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        dist.all_reduce(x)
        return x

    def gather(self, x: torch.Tensor) -> torch.Tensor | None:
        """The ranks' x concatenated along the last dim on rank 0; None on the others."""
        if self.rank != 0:
            dist.gather(x, None, dst=0)
            return None
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.gather(x, parts, dst=0)
        return torch.cat(parts, dim=-1)

    def min(self, value: int) -> int:
        """The smallest of the ranks' values (e.g. KV blocks, where free memory differs)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x into every rank's x."""
        dist.broadcast(x, src=0)
        return x

    def send_command(self, command: str, **fields) -> None:
        """Rank 0: tell the other ranks what comes next ("step", "warmup", "stop")."""
        text = json.dumps({"command": command, **fields}).encode()
        if len(text) > HEADER_BYTES:
            raise ValueError(f"command header of {len(text)} bytes exceeds {HEADER_BYTES}")
        header = torch.full((HEADER_BYTES,), ord(" "), dtype=torch.uint8)
        header[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        self.broadcast(to_device(header, torch.uint8, self.device))  # no wait for the step in flight

    def receive_command(self) -> dict:
        header = self.broadcast(torch.empty(HEADER_BYTES, dtype=torch.uint8, device=self.device))
        return json.loads(bytes(header.cpu().numpy()))


SINGLE = TensorParallelGroup()


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r runs on the r-th GPU after rank 0's; every rank of a CPU group on the CPU."""
    if device.type != "cuda":
        return device
    index = device.index + rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"tensor-parallel rank {rank} needs cuda:{index}, but only "
                         f"{torch.cuda.device_count()} CUDA device(s) are visible (rank 0 is on {device})")
    return torch.device("cuda", index)


def init_group(store: dist.Store, rank: int, size: int, device: torch.device) -> TensorParallelGroup:
    """Join the default process group of `size` ranks through `store`."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        for key, value in NO_MULTICAST.items():
            os.environ.setdefault(key, value)
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=size)
    return TensorParallelGroup(rank, size, device)


def destroy_group(timeout_s: float | None = None) -> bool:
    """Leave the default group; with `timeout_s`, give up waiting after it (True if it was left).
    NCCL's destroy can block for good once a peer is gone (seen on two H200s): a process that gives
    up keeps the group's threads until it exits, so a new group in it is refused."""
    if not dist.is_initialized():
        return True
    if timeout_s is None:
        dist.destroy_process_group()
        return True
    done = threading.Event()

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        finally:
            done.set()

    threading.Thread(target=destroy, name="destroy-process-group", daemon=True).start()
    return done.wait(timeout_s)
