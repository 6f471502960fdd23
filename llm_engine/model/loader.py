"""Build the model for a checkpoint folder and fill its weights from safetensors, by name.

The model is created uninitialised on the target device in the target dtype; each parameter is then
copied from its checkpoint tensor(s), converting on the fly. Tensors are read through safetensors'
lazy `get_slice`, so a tensor-parallel rank reads just its rows or columns of each split tensor
(the parameter's `tensor_shard`) without materialising the rest. Fused parameters (qkv_proj,
gate_up_proj) are filled shard by shard from the separate q/k/v and gate/up checkpoint tensors;
under tensor parallelism each from this rank's block of q, k, v, gate and up.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from llm_engine.config import EngineConfig
from llm_engine.model.layers.parallel_linear import TensorShard
from llm_engine.model.registry import get_model_class
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup

INDEX_FILE = "model.safetensors.index.json"
# Checkpoint tensors that are derived state, not weights (old Llama exports saved the RoPE buffer).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
    in config.torch_dtype, in eval mode."""
    model_config = config.model_config
    model_class = get_model_class(model_config.architecture)
    device = config.torch_device
    with torch.device(device), _default_dtype(config.torch_dtype):
        model = model_class(model_config.per_rank(tp.size), config.max_model_len, tp)
    with SafetensorsCheckpoint(model_config.path, device) as checkpoint:
        load_weights(model, checkpoint)
    return model.eval()


def load_weights(model: nn.Module, checkpoint: SafetensorsCheckpoint) -> None:
    """Fill every parameter of `model` from `checkpoint`; clear errors for missing or unknown tensors."""
    expected = dict(_checkpoint_targets(model))
    available = checkpoint.names()
    missing = sorted(set(expected) - available)
    if missing:
        raise ValueError(
            f"checkpoint {checkpoint.folder} is missing {len(missing)} tensor(s) the "
            f"{type(model).__name__} needs, e.g. {', '.join(missing[:5])}"
        )
    ignored = {n for n in available if n.endswith(_IGNORED_SUFFIXES)}
    ignored |= set(getattr(model, "tied_checkpoint_tensors", ()))
    unknown = sorted(available - set(expected) - ignored)
    if unknown:
        raise ValueError(
            f"checkpoint {checkpoint.folder} has {len(unknown)} tensor(s) {type(model).__name__} does not "
            f"use (a config/weights mismatch?), e.g. {', '.join(unknown[:5])}"
        )
    for name, (param, shard_id) in expected.items():
        _copy_into(param, shard_id, checkpoint.get_slice(name), name)


def _checkpoint_targets(model: nn.Module) -> Iterator[tuple[str, tuple[nn.Parameter, object]]]:
    """(checkpoint tensor name, (parameter, shard id)) for every tensor the model reads.

    `model.packed_modules_mapping` maps a fused module to the checkpoint modules stacked into it,
    e.g. {"qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")]}.
    """
    packed = getattr(model, "packed_modules_mapping", {})
    for param_name, param in model.named_parameters():
        module_path, _, leaf = param_name.rpartition(".")
        parent, _, module = module_path.rpartition(".")
        if module in packed:
            for source, shard_id in packed[module]:
                yield f"{parent}.{source}.{leaf}", (param, shard_id)
        else:
            yield param_name, (param, None)


def _copy_into(param: nn.Parameter, shard_id, tensor_slice, name: str) -> None:
    target = param.data
    if shard_id is not None:
        offset, size = param.shard_offsets[shard_id]
        target = target.narrow(0, offset, size)
    shape = tuple(tensor_slice.get_shape())
    shard = getattr(param, "tensor_shard", None)
    if shard is None:
        if shape != tuple(target.shape):
            raise ValueError(f"checkpoint tensor {name} has shape {shape}; the model expects {tuple(target.shape)}")
        target.copy_(tensor_slice[:])
    else:
        _copy_shard(target, shard, tensor_slice, shape, name)


def _copy_shard(target: torch.Tensor, shard: TensorShard, tensor_slice, shape: tuple[int, ...], name: str) -> None:
    """Read block shard.rank of the checkpoint tensor along shard.dim into target."""
    dim, block = shard.dim, target.shape[shard.dim]
    total = block * shard.size
    if shard.padded and -(-shape[dim] // shard.size) == block:
        total = shape[dim]  # the vocabulary: the last block is short
    expected = tuple(target.shape[:dim]) + (total,) + tuple(target.shape[dim + 1:])
    if shape != expected:
        raise ValueError(f"checkpoint tensor {name} has shape {shape}; tensor-parallel rank {shard.rank} of "
                         f"{shard.size} expects {expected}, split along dim {dim} into blocks of {block}")
    start = min(shard.rank * block, total)
    rows = min(start + block, total) - start
    if rows:
        target.narrow(dim, 0, rows).copy_(tensor_slice[(slice(None),) * dim + (slice(start, start + rows),)])
    target.narrow(dim, rows, block - rows).zero_()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
