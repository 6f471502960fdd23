"""Per-GPU launch parameters (block sizes, warps, stages, register caps, split heuristics) read from JSON data.

`launch_configs/<family>.json` is used when one of its "_devices" (<family>, the file stem, when
absent) appears in the lower-cased CUDA device name: h200.json for "NVIDIA H200" and, since the same
Hopper tiles measured faster there too, "NVIDIA H100 80GB HBM3"; anything else, and CPU/interpreter
runs, use default.json. Each kernel's section holds a "default" entry and optional overrides per dtype
or variant: "float32": {...} for tiles that would not fit in shared memory at 4 bytes an element,
"float8_e4m3fn": {...} for FP8 KV, whose half-size tiles want longer loops in flight,
"single_row": {...} for skinny_linear's one-row variant on the CUDA cores; and row buckets,
"m<=64": {...} for a GEMM of at most 64 rows (launch_params_for_rows: the smallest bucket that holds
the rows; past the largest, none).
Values are chosen offline: nothing is autotuned on the hot path. `override_launch_params` lets
a benchmark sweep try other values without editing the JSON.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "launch_configs"
_overrides: dict[str, dict] = {}


def launch_params(kernel: str, device: torch.device, *entries: torch.dtype | str) -> dict:
    """Parameters of one kernel: its "default" entry, overlaid by the entries named after each
    of entries in turn (dtypes, e.g. the query's, then the KV cache's; or a variant's name), then
    by any override_launch_params in force.

    A GPU family's file may leave kernels out; those come from default.json. The result is
    shared between calls (every layer's launches ask): read it, do not modify it.
    """
    params = _configured(kernel, _device_family(device), entries)
    override = _overrides.get(kernel)
    if not override:
        return params
    unknown = set(override) - set(params)
    if unknown:
        raise KeyError(f"{kernel} has no launch parameters {sorted(unknown)}; it has {sorted(params)}")
    return {**params, **override}


def launch_params_for_rows(kernel: str, device: torch.device, rows: int, *entries: torch.dtype | str) -> dict:
    """launch_params with, after `entries`, the section's "m<=R" entry of the smallest R >= rows (a GEMM's
    tiles, or whether cuBLAS or Triton runs it, per batch size)."""
    buckets = _row_buckets(kernel, _device_family(device))
    bucket = next((b for b in buckets if rows <= b), None)
    return launch_params(kernel, device, *entries, *(() if bucket is None else (f"m<={bucket}",)))


@functools.cache
def _row_buckets(kernel: str, family: str) -> tuple[int, ...]:
    section = _config_for(family).get(kernel) or _config_for("default")[kernel]
    return tuple(sorted(int(name[3:]) for name in section if name.startswith("m<=")))


@functools.cache
def _configured(kernel: str, family: str, entries: tuple[torch.dtype | str, ...]) -> dict:
    section = _config_for(family).get(kernel) or _config_for("default")[kernel]
    params = dict(section["default"])
    for entry in entries:
        params.update(section.get(entry if isinstance(entry, str) else str(entry).removeprefix("torch."), {}))
    return params


@contextlib.contextmanager
def override_launch_params(kernel: str, **params):
    """Within the block, launches of kernel use params over its configured values (not thread-safe)."""
    previous = _overrides.get(kernel)
    _overrides[kernel] = {**(previous or {}), **params}
    try:
        yield
    finally:
        if previous is None:
            del _overrides[kernel]
        else:
            _overrides[kernel] = previous


def interpreting() -> bool:
    """Whether kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 before their import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _device_family(device: torch.device) -> str:
    if device.type != "cuda" or interpreting():
        return "default"
    return family_for_name(torch.cuda.get_device_name(device))


def family_for_name(device_name: str) -> str:
    """The launch config for a CUDA device name: the first file (by stem) with one of its "_devices" in
    the name, else "default"."""
    name = device_name.lower()
    for path in sorted(CONFIG_DIR.glob("*.json")):
        parts = _config_for(path.stem).get("_devices", [path.stem])
        if path.stem != "default" and any(part in name for part in parts):
            return path.stem
    return "default"


@functools.cache
def _config_for(family: str) -> dict:
    return json.loads((CONFIG_DIR / f"{family}.json").read_text())
