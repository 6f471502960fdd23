"""Write compressed-tensors FP8 checkpoints with this engine's quantizer (kernels/fp8_quant.py).

The layout is the one llm-compressor writes for its FP8 schemes and vLLM loads: each decoder
projection (q/k/v/o, gate/up/down) as `<module>.weight` float8_e4m3fn with `<module>.weight_scale`
float32, [out_features, 1] per channel or [1] per tensor, and with static activation scales
`<module>.input_scale` [1]; everything else (embeddings, norms, LM head) as it was; config.json gains
`quantization_config` (quant_method "compressed-tensors", format "float-quantized", one config group
targeting Linear, the LM head ignored). The engine loads it tensor for tensor as it quantizes the
unquantized checkpoint at load (quantization "fp8"), from the values as stored.

    python -m llm_engine.model.fp8_checkpoint SRC DST [--strategy tensor] [--input-scale 0.05]
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llm_engine.kernels.fp8_quant import quantize_fp8_weight_ref
from llm_engine.kernels.kv_store import FP8_E4M3_MAX, fp8_scale_ref

QUANTIZED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INDEX_FILE = "model.safetensors.index.json"


def is_quantized_weight(name: str) -> bool:
    """Whether a checkpoint tensor is a decoder projection's weight, which FP8 checkpoints quantize."""
    module, _, leaf = name.rpartition(".")
    return leaf == "weight" and ".layers." in name and module.rpartition(".")[2] in QUANTIZED_MODULES


def quantize_weight(weight: torch.Tensor, strategy: str = "channel") -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (e4m3 values [N, K], float32 weight_scale: [N, 1] per channel, [1] per tensor)."""
    if strategy == "channel":
        values, scale = quantize_fp8_weight_ref(weight)
        return values, scale[:, None]
    if strategy != "tensor":
        raise ValueError(f"strategy must be 'channel' or 'tensor', got {strategy!r}")
    scale = fp8_scale_ref(weight.float().abs().amax()).reshape(1)  # as the per-channel scales, on any device
    values = (weight.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def quantize_state(tensors: dict[str, torch.Tensor], strategy: str = "channel",
                   input_scale: float | None = None) -> dict[str, torch.Tensor]:
    """A state dict (or part of one) in the FP8 layout: projection weights quantized with their scales,
    and with `input_scale` a static activation scale per projection; other tensors unchanged."""
    out = {}
    for name, tensor in tensors.items():
        if not is_quantized_weight(name):
            out[name] = tensor
            continue
        module = name.removesuffix(".weight")
        out[name], out[f"{module}.weight_scale"] = quantize_weight(tensor, strategy)
        if input_scale is not None:
            out[f"{module}.input_scale"] = torch.tensor([input_scale], dtype=torch.float32)
    return out


def quantization_config(strategy: str = "channel", static_input: bool = False) -> dict:
    """config.json's quantization_config for checkpoints quantize_state writes."""
    activations = ({"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
                   if static_input else
                   {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True})
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False},
            "input_activations": activations,
        }},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def write_fp8_checkpoint(src: str | Path, dst: str | Path, strategy: str = "channel",
                         input_scale: float | None = None) -> Path:
    """The unquantized HF folder src as an FP8 compressed-tensors folder dst (its other files copied);
    each safetensors file keeps its name, its tensors quantized one at a time."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{src / 'config.json'} already has a quantization_config")
    weight_map, total_size = {}, 0
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            tensors = quantize_state({name: f.get_tensor(name) for name in f.keys()}, strategy, input_scale)
            metadata = f.metadata() or {"format": "pt"}
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(dst / file.name), metadata=metadata)
        weight_map.update({name: file.name for name in tensors})
        total_size += sum(t.numel() * t.element_size() for t in tensors.values())
    if (src / INDEX_FILE).is_file():
        (dst / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map},
                                                 indent=2))
    config["quantization_config"] = quantization_config(strategy, input_scale is not None)
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in ("config.json", INDEX_FILE):
            shutil.copy2(path, dst / path.name)
    return dst


def positive_float(text: str) -> float:
    """A scale as the checkpoint stores it (float32): finite and > 0 there too (1e-50 would be 0, 1e39 inf)."""
    value = torch.tensor(float(text), dtype=torch.float32)
    if not (torch.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 in float32; got {text}")
    return value.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="an unquantized HF checkpoint folder")
    parser.add_argument("dst", type=Path)
    parser.add_argument("--strategy", choices=("channel", "tensor"), default="channel")
    parser.add_argument("--input-scale", type=positive_float, default=None,
                        help="a static activation scale for every projection (default: dynamic per token)")
    args = parser.parse_args(argv)
    print(write_fp8_checkpoint(args.src, args.dst, args.strategy, args.input_scale))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
