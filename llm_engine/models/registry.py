"""HF `architectures` name -> the engine's model class."""
from __future__ import annotations

from torch import nn

from llm_engine.models.llama import LlamaForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
}
SUPPORTED_ARCHITECTURES = tuple(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(f"architecture {architecture!r} is not supported; supported: {', '.join(_MODELS)}")
    return _MODELS[architecture]
