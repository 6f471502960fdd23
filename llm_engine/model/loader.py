"""Build the model for a checkpoint folder and fill its weights from safetensors, by name.

The model is created uninitialised on the target device in the target dtype; each parameter is then
copied from its checkpoint tensor(s), converting on the fly. Tensors are read through safetensors'
lazy `get_slice`, so a tensor-parallel rank reads just its rows or columns of each split tensor
(the parameter's `tensor_shard`) without materialising the rest. Fused parameters (qkv_proj,
gate_up_proj) are filled shard by shard from the separate q/k/v and gate/up checkpoint tensors;
under tensor parallelism each from this rank's block of q, k, v, gate and up. FP8 projections:
load_weights.
"""
from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from llm_engine.config import EngineConfig
from llm_engine.kernels.fp8_quant import FP8, quantize_fp8_weight_ref
from llm_engine.model.layers.parallel_linear import TensorShard
from llm_engine.model.registry import get_model_class
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup

INDEX_FILE = "model.safetensors.index.json"
# Checkpoint tensors that are derived state, not weights (old Llama exports saved the RoPE buffer; FP8
# checkpoints may carry static KV-cache scales, where this engine's FP8 KV cache scales each token itself).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "self_attn.k_scale", "self_attn.v_scale", "self_attn.kv_scale",
                     "k_proj.output_scale", "v_proj.output_scale")


class SafetensorsCheckpoint:
    """Tensor name -> lazy slice over a folder's single or sharded `*.safetensors` files."""

    def __init__(self, folder: str | Path, device: torch.device | str = "cpu") -> None:
        self.folder = Path(folder)
        self.device = str(device)
        self.weight_map = self._weight_map()
        self._handles: dict[str, object] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self._handles.clear()

    def names(self) -> set[str]:
        return set(self.weight_map)

    def get_slice(self, name: str):
        if name not in self.weight_map:
            raise KeyError(f"tensor {name!r} is not in the checkpoint at {self.folder}")
        file = self.weight_map[name]
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(
                safe_open(str(self.folder / file), framework="pt", device=self.device))
        return self._handles[file].get_slice(name)

    def _weight_map(self) -> dict[str, str]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            missing = sorted({file for file in weight_map.values() if not (self.folder / file).is_file()})
            if missing:
                raise FileNotFoundError(f"{index} lists shard(s) missing from the folder: {', '.join(missing)}")
            return weight_map
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {self.folder} (only safetensors checkpoints load)")
        weight_map = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                weight_map.update({name: file.name for name in f.keys()})
        return weight_map


def load_model(config: EngineConfig, tp: TensorParallelGroup = SINGLE) -> nn.Module:
    """The model of config.model (rank tp.rank's shard of it) with its weights, on config.torch_device
    in config.torch_dtype (FP8 projections per config.weight_quantization), in eval mode."""
    model_config = config.model_config
    model_class = get_model_class(model_config.architecture)
    device = config.torch_device
    with torch.device(device), _default_dtype(config.torch_dtype):
        model = model_class(model_config.per_rank(tp.size), config.max_model_len, tp, config.weight_quantization)
    plan = config.weight_quantization
    if plan is not None and not any(p.dtype == FP8 for p in model.parameters()):
        raise ValueError(f"{model_config.path / 'config.json'}: quantization_config's targets "
                         f"{[list(targets) for targets, _ in plan.groups]} (ignore {list(plan.ignore)}) match none of "
                         f"{type(model).__name__}'s projections, so nothing would run in FP8")
    with SafetensorsCheckpoint(model_config.path, device) as checkpoint:
        load_weights(model, checkpoint)
    return model.eval()


def load_weights(model: nn.Module, checkpoint: SafetensorsCheckpoint) -> None:
    """Fill every parameter of `model` from `checkpoint`; clear errors for missing or unknown tensors.

    FP8 projections (model/layers/linear.py) take float8_e4m3fn checkpoint tensors as they are, with
    their weight_scale (per channel, or one per tensor: repeated over its rows) and input_scale (the
    largest of those stacked into one projection); from an unquantized checkpoint, each weight is
    quantized per output channel on the device as it is read (this rank's slice of it), so no
    full-precision copy of the model is ever held. A float8 tensor for a parameter kept in the model
    dtype (an LM head the checkpoint quantized) is dequantized with its weight_scale.
    """
    expected = dict(_checkpoint_targets(model))
    available = checkpoint.names()
    missing = sorted(set(expected) - available)
    if missing:
        raise ValueError(
            f"checkpoint {checkpoint.folder} is missing {len(missing)} tensor(s) the "
            f"{type(model).__name__} needs, e.g. {', '.join(missing[:5])}"
        )
    # FP8 tensors (with their scales) for parameters kept in the model dtype.
    dequantized = {name: _scale_name(name) for name, (param, _) in expected.items()
                   if param.dtype != FP8 and getattr(param, "fp8_kind", None) is None
                   and _scale_name(name) in available and checkpoint.get_slice(name).get_dtype() == "F8_E4M3"}
    ignored = {n for n in available if n.endswith(_IGNORED_SUFFIXES)}
    ignored |= set(getattr(model, "tied_checkpoint_tensors", ())) | set(dequantized.values())
    ignored |= {_input_scale_name(name) for name in dequantized} & available   # of a static scheme: unused here
    unknown = sorted(available - set(expected) - ignored)
    if unknown:
        raise ValueError(
            f"checkpoint {checkpoint.folder} has {len(unknown)} tensor(s) {type(model).__name__} does not "
            f"use (a config/weights mismatch?), e.g. {', '.join(unknown[:5])}"
        )
    for name, (param, shard_id) in expected.items():
        tensor_slice = checkpoint.get_slice(name)
        kind = getattr(param, "fp8_kind", None)
        if kind == "weight_scale":
            _load_weight_scale(param, shard_id, tensor_slice, name)
        elif kind == "input_scale":
            _load_input_scale(param, tensor_slice, name)
        elif param.dtype == FP8:
            _load_fp8_weight(param, shard_id, tensor_slice, name)
        elif name in dequantized:
            scale = _checked_scales(_whole(checkpoint.get_slice(dequantized[name])).float(), dequantized[name])
            _copy_into(param, shard_id, tensor_slice, name, scale.reshape(-1 if scale.numel() > 1 else ()))
        else:
            _copy_into(param, shard_id, tensor_slice, name)


def _checkpoint_targets(model: nn.Module) -> Iterator[tuple[str, tuple[nn.Parameter, object]]]:
    """(checkpoint tensor name, (parameter, shard id)) for every tensor the model reads (not the scales
    of weights quantized at load, which come with the weights).

    `model.packed_modules_mapping` maps a fused module to the checkpoint modules stacked into it,
    e.g. {"qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")]}.
    """
    packed = getattr(model, "packed_modules_mapping", {})
    for param_name, param in model.named_parameters():
        if getattr(param, "from_checkpoint", True) is False:
            continue
        module_path, _, leaf = param_name.rpartition(".")
        parent, _, module = module_path.rpartition(".")
        if module in packed:
            for source, shard_id in packed[module]:
                yield f"{parent}.{source}.{leaf}", (param, shard_id)
        else:
            yield param_name, (param, None)


def _copy_into(param: nn.Parameter, shard_id, tensor_slice, name: str, dequant_scale: torch.Tensor | None = None
               ) -> None:
    """Copy the checkpoint tensor (this rank's block of it) into param (its shard_id rows); a float8
    one multiplied by dequant_scale first (one per row of the whole tensor, or one for all)."""
    target = _rows(param, shard_id)
    shape = tuple(tensor_slice.get_shape())
    shard = getattr(param, "tensor_shard", None)
    if shard is None:
        if shape != tuple(target.shape):
            raise ValueError(f"checkpoint tensor {name} has shape {shape}; the model expects {tuple(target.shape)}")
        target.copy_(_dequantized(tensor_slice[:], dequant_scale, 0, shape[0], name))
    else:
        _copy_shard(target, shard, tensor_slice, shape, name, dequant_scale)


def _copy_shard(target: torch.Tensor, shard: TensorShard, tensor_slice, shape: tuple[int, ...], name: str,
                dequant_scale: torch.Tensor | None = None) -> None:
    """Read block shard.rank of the checkpoint tensor along shard.dim into target."""
    dim, block = shard.dim, target.shape[shard.dim]
    start, rows = _block(shard, shape, tuple(target.shape), name)
    if rows:
        part = tensor_slice[(slice(None),) * dim + (slice(start, start + rows),)]
        first_row, num_rows = (start, rows) if dim == 0 else (0, shape[0])
        target.narrow(dim, 0, rows).copy_(_dequantized(part, dequant_scale, first_row, num_rows, name))
    target.narrow(dim, rows, block - rows).zero_()


def _block(shard: TensorShard, shape: tuple[int, ...], target_shape: tuple[int, ...], name: str) -> tuple[int, int]:
    """(first index, length) along shard.dim of rank shard.rank's block of a checkpoint tensor of `shape`
    for a parameter of target_shape; the length falls short of the block only for a padded tensor."""
    dim, block = shard.dim, target_shape[shard.dim]
    total = block * shard.size
    if shard.padded and -(-shape[dim] // shard.size) == block:
        total = shape[dim]  # the vocabulary: the last block is short
    expected = target_shape[:dim] + (total,) + target_shape[dim + 1:]
    if shape != expected:
        raise ValueError(f"checkpoint tensor {name} has shape {shape}; tensor-parallel rank {shard.rank} of "
                         f"{shard.size} expects {expected}, split along dim {dim} into blocks of {block}")
    start = min(shard.rank * block, total)
    return start, min(start + block, total) - start


def _read_block(target_shape: tuple[int, ...], shard: TensorShard | None, tensor_slice, name: str) -> torch.Tensor:
    """The checkpoint values a parameter of target_shape holds: the whole tensor, or this rank's block."""
    shape = tuple(tensor_slice.get_shape())
    if shard is None:
        if shape != target_shape:
            raise ValueError(f"checkpoint tensor {name} has shape {shape}; the model expects {target_shape}")
        return tensor_slice[:]
    start, rows = _block(shard, shape, target_shape, name)
    return tensor_slice[(slice(None),) * shard.dim + (slice(start, start + rows),)]


def _dequantized(part: torch.Tensor, scale: torch.Tensor | None, first_row: int, num_rows: int, name: str
                 ) -> torch.Tensor:
    if scale is None:
        if part.dtype == FP8:
            raise ValueError(f"checkpoint tensor {name} is float8_e4m3fn without its {_scale_name(name)}")
        _expect_full_precision(part, name)
        return part
    rows = scale if scale.dim() == 0 else scale[first_row:first_row + num_rows, None]
    return part.float() * rows


def _expect_full_precision(tensor: torch.Tensor, name: str) -> None:
    """A weight read as it is, or quantized here: float16, bfloat16 or float32; other 8-bit or integer storage
    (a quantized checkpoint whose config was lost) would load as noise."""
    if not tensor.dtype.is_floating_point or tensor.dtype.itemsize < 2:
        raise ValueError(f"checkpoint tensor {name} is {tensor.dtype}: a weight must be float16, bfloat16 or "
                         "float32, or float8_e4m3fn with its scale and the checkpoint's quantization_config")


def _rows(param: nn.Parameter, shard_id) -> torch.Tensor:
    """The rows of param that checkpoint tensor `shard_id` fills (all of it when None)."""
    if shard_id is None:
        return param.data
    offset, size = param.shard_offsets[shard_id]
    return param.data.narrow(0, offset, size)


def _whole(tensor_slice) -> torch.Tensor:
    return tensor_slice[...] if not tensor_slice.get_shape() else tensor_slice[:]


def _scale_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "weight_scale"


def _input_scale_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "input_scale"


def _checked_scales(values: torch.Tensor, name: str, zero_ok: bool = True) -> torch.Tensor:
    """`values` if every scale is finite and not negative (`zero_ok`: a weight scale of 0 is an all-zero
    channel; an input scale divides, so it must be positive); else a ValueError naming the tensor and a bad
    value, rather than NaN or garbage logits from a load that seemed to work."""
    bad = ~(torch.isfinite(values) & ((values >= 0) if zero_ok else (values > 0)))
    if bad.any():
        raise ValueError(f"checkpoint tensor {name}: scales must be finite and {'>= 0' if zero_ok else '> 0'}; "
                         f"{int(bad.sum())} of {values.numel()} are not, e.g. {values[bad].flatten()[0].item()}")
    return values


# Rows quantized at a time: bounds the float32 temporaries of quantizing one large weight.
_QUANTIZE_ROWS = 4096


def _load_fp8_weight(param: nn.Parameter, shard_id, tensor_slice, name: str) -> None:
    """An FP8 projection's weight rows: a float8_e4m3fn checkpoint tensor's bytes, or a higher-precision
    one quantized per output channel here (its scales into the layer's weight_scale rows)."""
    target = _rows(param, shard_id)
    scale_param = param.fp8_scale
    quantize_here = getattr(scale_param, "from_checkpoint", True) is False
    src = _read_block(tuple(target.shape), getattr(param, "tensor_shard", None), tensor_slice, name)
    if (src.dtype == FP8) == quantize_here:
        raise ValueError(f"checkpoint tensor {name} is {src.dtype}, but "
                         + ("the checkpoint has no quantization_config: an FP8 checkpoint needs one"
                            if quantize_here else "its quantization_config makes it an FP8 (float8_e4m3fn) weight"))
    if not quantize_here:
        target.view(torch.uint8).copy_(src.view(torch.uint8))
        return
    _expect_full_precision(src, name)
    scales = _rows(scale_param, shard_id)
    for start in range(0, src.shape[0], _QUANTIZE_ROWS):
        values, scale = quantize_fp8_weight_ref(src[start:start + _QUANTIZE_ROWS])
        target[start:start + _QUANTIZE_ROWS].view(torch.uint8).copy_(values.view(torch.uint8))
        scales[start:start + _QUANTIZE_ROWS].copy_(scale)


def _load_weight_scale(param: nn.Parameter, shard_id, tensor_slice, name: str) -> None:
    """An FP8 weight's scales: per channel ([N] or [N, 1], this rank's rows of it) or per tensor (one
    value for every row of that checkpoint tensor)."""
    target = _rows(param, shard_id)
    shape = tuple(tensor_slice.get_shape())
    if math.prod(shape) == 1:
        target.copy_(_checked_scales(_whole(tensor_slice).float(), name).reshape(()).expand(target.shape))
        return
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise ValueError(f"checkpoint tensor {name} has shape {shape}; a weight scale is one per output channel "
                         f"([{target.shape[0]}] or [{target.shape[0]}, 1] on this rank) or one per tensor")
    values = _read_block((target.shape[0],) + shape[1:], getattr(param, "tensor_shard", None), tensor_slice, name)
    target.copy_(_checked_scales(values.float(), name).reshape(-1))


def _load_input_scale(param: nn.Parameter, tensor_slice, name: str) -> None:
    """A static activation scale: the largest over the checkpoint modules stacked into the projection,
    which all see its one input."""
    if math.prod(tuple(tensor_slice.get_shape())) != 1:
        raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor_slice.get_shape())}; only one input "
                         "scale per tensor (strategy 'tensor') is supported")
    value = _checked_scales(_whole(tensor_slice).float(), name, zero_ok=False).reshape(())
    param.data.copy_(torch.maximum(param.data, value.to(param.device)))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
