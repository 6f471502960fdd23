"""Contract checks shared by the kernel wrappers: clear ValueErrors instead of silent garbage."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from llm_engine.kernels.launch_config import interpreting


def expect_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(tensor.shape)}")


def expect_shape(name: str, tensor: torch.Tensor, shape: Sequence[int]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")


def expect_dtype(name: str, tensor: torch.Tensor, dtypes: Sequence[torch.dtype]) -> None:
    if tensor.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} must have dtype in ({names}), got {tensor.dtype}")


def expect_last_dim_contiguous(name: str, tensor: torch.Tensor) -> None:
    # Kernels address rows by stride and vectorize over the last dim.
    if tensor.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {tensor.stride()}")


def expect_power_of_two(name: str, value: int, minimum: int) -> None:
    if value < minimum or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {minimum}, got {value}")


def expect_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def expect_launchable(name: str, tensor: torch.Tensor, ref_name: str) -> None:
    # Compiled Triton kernels read device memory; CPU tensors only work under the interpreter.
    if tensor.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{name} is on {tensor.device}: Triton kernels need a CUDA tensor "
            f"(or TRITON_INTERPRET=1); use {ref_name} on CPU"
        )


def expect_kv_scales(
    k_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> None:
    """FP8 caches need per-(token, kv-head) float32 scales, [blocks, kv_heads, block_size];
    other caches must not get any."""
    if k_cache.dtype == torch.float8_e4m3fn:
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is None:
                raise ValueError(f"{name} is required for a float8_e4m3fn KV cache")
            expect_shape(name, scale, (k_cache.shape[0], k_cache.shape[2], k_cache.shape[1]))
            expect_dtype(name, scale, (torch.float32,))
            if not scale.is_contiguous():
                raise ValueError(f"{name} must be contiguous")
    elif k_scale is not None or v_scale is not None:
        raise ValueError(f"k_scale/v_scale must be None for a {k_cache.dtype} KV cache")


def expect_paged_attention_args(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale, v_scale) -> None:
    """The shared contract of paged decode and prefill attention (q [T, Hq, D], paged caches)."""
    # The kernels take each row's max before the softmax scale, which only a positive scale allows.
    if not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
        raise ValueError(f"scale must be a positive finite number (head_dim ** -0.5 as a rule), got {scale!r}")
    expect_ndim("q", q, 3, "[num_tokens, num_q_heads, head_dim]")
    expect_ndim("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    expect_shape("v_cache", v_cache, k_cache.shape)
    expect_dtype("v_cache", v_cache, (k_cache.dtype,))
    if k_cache.dtype != torch.float8_e4m3fn:
        expect_dtype("k_cache", k_cache, (q.dtype,))
    expect_dtype("q", q, (torch.float32, torch.float16, torch.bfloat16))
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim must be q's {head_dim}, got {k_cache.shape[3]}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    expect_ndim("block_tables", block_tables, 2, "[batch, max_blocks_per_seq]")
    expect_dtype("block_tables", block_tables, (torch.int32, torch.int64))
    expect_shape("context_lens", context_lens, (block_tables.shape[0],))
    expect_dtype("context_lens", context_lens, (torch.int32, torch.int64))
    expect_last_dim_contiguous("q", q)
    expect_last_dim_contiguous("block_tables", block_tables)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    expect_kv_scales(k_cache, k_scale, v_scale)
    expect_same_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                       context_lens=context_lens, k_scale=k_scale, v_scale=v_scale)


def output_like(out: torch.Tensor | None, like: torch.Tensor, name: str = "out") -> torch.Tensor:
    """Where an op writes: `out` (a caller's buffer of `like`'s shape and dtype, e.g. a CUDA graph's
    static buffer; rows may be strided) or a new tensor like `like`."""
    if out is None:
        return torch.empty_like(like)
    expect_shape(name, out, like.shape)
    expect_dtype(name, out, (like.dtype,))
    expect_last_dim_contiguous(name, out)
    if out.device != like.device:
        raise ValueError(f"{name} is on {out.device}, the input on {like.device}")
    return out
