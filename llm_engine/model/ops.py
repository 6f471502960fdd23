"""The engine's hot-path ops: the Triton kernels for CUDA tensors, their torch references otherwise.

LLM_ENGINE_KERNELS (read at import) overrides the choice: "triton" always (CPU tensors then need
TRITON_INTERPRET=1, which is how tests run the kernels without a GPU), "ref" always, "auto" (default)
by the device of the op's first tensor.
"""
from __future__ import annotations

import os
from collections.abc import Callable

from llm_engine import kernels

_MODES = ("auto", "triton", "ref")
KERNELS_MODE = os.environ.get("LLM_ENGINE_KERNELS", "auto")
if KERNELS_MODE not in _MODES:
    raise ValueError(f"LLM_ENGINE_KERNELS must be one of {', '.join(_MODES)}; got {KERNELS_MODE!r}")


def _select(name: str) -> Callable:
    triton_op, ref_op = getattr(kernels, name), getattr(kernels, f"{name}_ref")
    if KERNELS_MODE == "triton":
        return triton_op
    if KERNELS_MODE == "ref":
        return ref_op

    def by_device(x, *args, **kwargs):
        return (triton_op if x.is_cuda else ref_op)(x, *args, **kwargs)

    by_device.__name__ = name
    by_device.__doc__ = triton_op.__doc__
    return by_device


rms_norm = _select("rms_norm")
rms_norm_quantize_fp8 = _select("rms_norm_quantize_fp8")
silu_and_mul = _select("silu_and_mul")
rotary_and_write_kv = _select("rotary_and_write_kv")
paged_decode_attention = _select("paged_decode_attention")
paged_prefill_attention = _select("paged_prefill_attention")
skinny_linear = _select("skinny_linear")
fp8_linear = _select("fp8_linear")
fp8_matmul = _select("fp8_matmul")
silu_and_mul_quantize_fp8 = _select("silu_and_mul_quantize_fp8")
apply_token_bitmask = _select("apply_token_bitmask")
