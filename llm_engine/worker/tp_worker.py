"""A tensor-parallel worker rank (1 .. size-1): `python -m llm_engine.worker.tp_worker`, started by rank 0.

It reads its start message (engine config, rank, size, the rendezvous port) from stdin, joins the
process group, builds a ModelRunner over its shard of the model and of the KV pool (start-up,
warm-up included, runs as on rank 0), then runs what rank 0 broadcasts until told to stop.

stdin stays open as long as rank 0 lives: end of file means rank 0 is gone, and the worker exits
at once, even in the middle of a collective (child_process.py). An error ends the process with its
traceback on stderr, which rank 0 relays and quotes (worker_group.py).
"""
from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist

from llm_engine.child_process import read_start_message
from llm_engine.worker.distributed import destroy_group, init_group, rank_device
from llm_engine.worker.worker_group import STOP_TIMEOUT_S
from llm_engine.worker.model_runner import ModelRunner
from llm_engine.worker.step_inputs import StepLayout


def serve(runner: ModelRunner) -> None:
    """Run rank 0's commands: each step's forward on this rank's shard, warm-ups, until "stop"."""
    tp = runner.tp
    while True:
        fields = tp.receive_command()
        command = fields.pop("command")
        if command == "stop":
            return
        if command == "warmup":
            runner.warmup()
            continue
        layout = StepLayout(**fields)
        layout.sizes = [(name, tuple(size) if isinstance(size, list) else size) for name, size in layout.sizes]
        runner.run_step(tp.broadcast(runner.step_buffer(layout)), layout)


def main() -> None:
    start = read_start_message()
    config, rank, size = start["config"], start["rank"], start["size"]
    device = rank_device(config.torch_device, rank)
    config.device = str(device)
    if device.type == "cpu":  # the ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    store = dist.TCPStore(start["host"], start["port"], size, is_master=False)
    store.set(f"started/{rank}", "1")
    runner = ModelRunner(config, init_group(store, rank, size, device))
    with torch.inference_mode():
        serve(runner)
    destroy_group(timeout_s=STOP_TIMEOUT_S)  # then exit: rank 0 kills a worker that does not


if __name__ == "__main__":
    # os._exit, not a normal exit: the process group's C++ threads can make interpreter teardown
    # abort (SIGABRT), and rank 0 reports the exit code it sees.
    code = 0
    try:
        main()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
