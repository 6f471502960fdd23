"""HF `architectures` name -> the engine's model class (the names: model_config.SUPPORTED_ARCHITECTURES)."""
from __future__ import annotations

from torch import nn

from llm_engine.model.llama import LlamaForCausalLM
from llm_engine.model_config import SUPPORTED_ARCHITECTURES

_MODELS: dict[str, type[nn.Module]] = {name: LlamaForCausalLM for name in SUPPORTED_ARCHITECTURES}


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(f"architecture {architecture!r} is not supported; supported: {', '.join(_MODELS)}")
    return _MODELS[architecture]
