"""Several instances of the llm (instance_group count K), one engine process per device.

Each instance is a stub of its own that sends its own requests' responses: one stub sends one
response at a time, an IPC round trip to the server each (~0.2 ms measured, docs/benchmarks-journal.md,
"The response path"), so with many streams on one stub their tokens queue behind each other. The
instances of one load on one device share one engine process (llm_engine/engine/engine_share.py):
the first to initialize starts it, the others join it, each client's requests and outputs its own.

This module says how many instances share an engine and names that engine: the serving process
(the stub's parent), the model, its version, the device and the whole model configuration.
"""
from __future__ import annotations

import os

from llm_engine.config import EngineConfig
from llm_engine.engine.engine_share import EngineShare


def instances_on_device(model_config: dict, kind: str, device_id: int) -> int:
    """The model's instances of this instance's `kind` ("GPU", "CPU", "MODEL": Triton's
    model_instance_kind) on its device: those of every group of that kind (Triton's normalized
    config lists a KIND_GPU group's GPUs)."""
    total = 0
    for group in model_config.get("instance_group") or [{"count": 1, "kind": f"KIND_{kind}"}]:
        if group.get("kind", "KIND_GPU") != f"KIND_{kind}":
            continue
        gpus = [int(g) for g in group.get("gpus") or []]
        if kind == "GPU" and gpus and device_id not in gpus:
            continue
        total += int(group.get("count", 1))
    return max(1, total)


def check_thread_engine(instances: int) -> None:
    """An engine in the stub (engine_process false) cannot be shared: one instance only."""
    if instances > 1:
        raise ValueError(f"engine_process false runs the engine in the stub, one engine per instance: give this "
                         f"model one instance (instance_group count 1, not {instances}), or run the engine in its "
                         "process (engine_process true) to share it between instances")


def engine_share(name: str, version: str, model_config: dict, config: EngineConfig, instances: int) -> EngineShare:
    """Where this load's instances on `config.device` meet their engine."""
    server = os.getppid()  # tritonserver: each server's instances have engines of their own
    identity = {"model": name, "version": version, "device": config.device, "model_config": model_config,
                "engine": repr(config)}
    # The labels let `ps` (and ragstack.process_tree) tell which model an engine process serves.
    label = ("--model", f"{name}/{version}", "--device", config.device, "--server", str(server))
    return EngineShare.named(identity, instances, label, owner=server)
