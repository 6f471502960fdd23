"""The architecture-level facts of an HF checkpoint folder, read from its config.json.

Read as plain JSON rather than through transformers' AutoConfig so the engine sees one normalised
view whichever transformers version wrote the file (v4 `rope_scaling`/`torch_dtype`, v5
`rope_parameters`/`dtype`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

# The HF `architectures` the engine runs (model/registry.py maps each to its class).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    path: Path
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # {"rope_type": "linear"|"llama3", ...}; None = plain RoPE
    qkv_bias: bool
    o_proj_bias: bool
    tie_word_embeddings: bool
    sliding_window: int | None          # None when every layer attends to the full context
    dtype: torch.dtype                  # the checkpoint's dtype
    eos_token_ids: tuple[int, ...]      # generation_config.json, else config.json
    # config.json's quantization_config (a quantized checkpoint: llm_engine/quantization.py), else None
    quantization_config: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def per_rank(self, tp_size: int) -> "ModelConfig":
        """The shapes one of `tp_size` tensor-parallel ranks holds: its attention heads, KV heads and
        MLP columns. Hidden size and vocabulary stay whole (the embedding splits the vocabulary)."""
        if tp_size == 1:
            return self
        split = {}
        for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            value = getattr(self, name)
            if value % tp_size:
                raise ValueError(f"tensor_parallel_size {tp_size} must divide the model's {name} {value} "
                                 f"({self.path / 'config.json'})")
            split[name] = value // tp_size
        return replace(self, **split)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"model folder {str(path)!r} does not exist")
        raw = _read_json(path / "config.json", required=True)
        architectures = raw.get("architectures") or []
        supported = [a for a in architectures if a in SUPPORTED_ARCHITECTURES]
        if not supported:
            raise ValueError(
                f"{path / 'config.json'}: architectures {architectures} are not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        arch = supported[0]

        def need(key: str) -> Any:
            if key not in raw:
                raise ValueError(f"{path / 'config.json'}: missing required field {key!r}")
            return raw[key]

        hidden_size, num_heads = int(need("hidden_size")), int(need("num_attention_heads"))
        if raw.get("mlp_bias"):
            raise ValueError(f"{path / 'config.json'}: mlp_bias=true is not supported")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{path / 'config.json'}: hidden_act {act!r} is not supported (only 'silu')")
        rope_theta, rope_scaling = _rope(raw, path)
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            path=path,
            architecture=arch,
            hidden_size=hidden_size,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
            vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(need("max_position_embeddings")),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            # Qwen2 always has q/k/v biases; Llama has q/k/v/o biases only with attention_bias.
            qkv_bias=arch == "Qwen2ForCausalLM" or attention_bias,
            o_proj_bias=arch == "LlamaForCausalLM" and attention_bias,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            sliding_window=_sliding_window(raw, arch),
            dtype=_checkpoint_dtype(raw, path),
            eos_token_ids=read_eos_token_ids(path),
            quantization_config=raw.get("quantization_config"),
        )


def read_eos_token_ids(path: str | Path) -> tuple[int, ...]:
    """The ids that end generation: generation_config.json's eos_token_id, else config.json's."""
    path = Path(path)
    generation = _read_json(path / "generation_config.json", required=False)
    eos = generation.get("eos_token_id", _read_json(path / "config.json", required=False).get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(int(e) for e in eos) if isinstance(eos, list) else (int(eos),)


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} not found: a model folder needs an HF config.json")
        return {}
    with open(path) as f:
        return json.load(f)


def _rope(raw: dict[str, Any], path: Path) -> tuple[float, dict[str, Any] | None]:
    # v5 folds theta and scaling into rope_parameters; v4 (and most hub files) use rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"{path / 'config.json'}: rope_type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    required = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
    missing = [k for k in required[rope_type] if k not in params]
    if missing:
        raise ValueError(f"{path / 'config.json'}: rope_type {rope_type!r} needs {missing}")
    return theta, {"rope_type": rope_type, **params}


def _sliding_window(raw: dict[str, Any], arch: str) -> int | None:
    window = raw.get("sliding_window")
    if arch == "Qwen2ForCausalLM" and not raw.get("use_sliding_window", False):
        return None  # Qwen2 configs carry a window they do not use unless use_sliding_window
    return int(window) if window else None


def _checkpoint_dtype(raw: dict[str, Any], path: Path) -> torch.dtype:
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if name not in _DTYPES:
        raise ValueError(f"{path / 'config.json'}: dtype {name!r} is not supported; supported: {', '.join(_DTYPES)}")
    return _DTYPES[name]
