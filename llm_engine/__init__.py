"""An LLM inference engine whose hot paths are OpenAI Triton kernels (no dependency on the Triton server).

Sub-packages, in the order a request meets them: `engine/` (the public LLM and LLMEngine, the
serving loop, the clients that run it in a thread or a process of its own, input and output
processing), `core/` (scheduler, KV block manager, sequences), `worker/` (model runner, CUDA
graphs, KV pool, sampler, tensor-parallel ranks), `model/` (the Llama family, its layers, loader,
tokenizer) and `kernels/` (the Triton kernels and their torch references). The names below are
imported on first use, so `import llm_engine.config` loads no model or kernel module.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "LLM": "llm_engine.engine.llm",
    "LLMEngine": "llm_engine.engine.llm_engine",
    "AsyncLLMEngine": "llm_engine.engine.async_engine",
    "EngineClient": "llm_engine.engine.client",
    "EngineProcessClient": "llm_engine.engine.process_client",
    "SamplingParams": "llm_engine.sampling_params",
    "EngineConfig": "llm_engine.config",
    "RequestOutput": "llm_engine.outputs",
    "RequestDelta": "llm_engine.outputs",
    "RequestStats": "llm_engine.outputs",
    "EngineStats": "llm_engine.outputs",
    "EngineOverloadedError": "llm_engine.errors",
    "EngineClosedError": "llm_engine.errors",
    "EngineDeadError": "llm_engine.errors",
    "EngineStartError": "llm_engine.errors",
    "RequestFailedError": "llm_engine.errors",
    "RequestRefusedError": "llm_engine.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
