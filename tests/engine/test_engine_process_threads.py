"""The engine process's torch threads (engine_process.torch_threads): one on a GPU, the cores left on the CPU."""
import os
from types import SimpleNamespace

import torch

from llm_engine.engine.engine_process import torch_threads


def test_one_thread_on_a_gpu_and_the_cores_less_one_per_rank_on_the_cpu():
    def config(device, ranks):
        return SimpleNamespace(torch_device=torch.device(device), tensor_parallel_size=ranks)

    cores = len(os.sched_getaffinity(0))
    assert torch_threads(config("cuda:0", 2)) == 1
    assert torch_threads(config("cpu", 1)) == max(1, cores - 1)
    assert torch_threads(config("cpu", cores)) == 1
