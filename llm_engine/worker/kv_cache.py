"""The paged KV pool: its size (from free GPU memory, or a token budget on CPU) and its allocation.

One allocation holds every layer's K and V, [2, num_layers, num_blocks, block_size, num_kv_heads,
head_dim]; each layer gets contiguous views of it. FP8 caches add float32 scales, one per
(token, kv head).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from llm_engine.model_config import ModelConfig

# Step tensors (slot_mapping) are int32: every slot of the pool must fit.
MAX_SLOTS = 2**31 - 1


@dataclass
class KVCache:
    num_blocks: int
    block_size: int
    kv: torch.Tensor                  # [2, layers, blocks, block_size, kv_heads, head_dim]
    scales: torch.Tensor | None       # float32 [2, layers, blocks, kv_heads, block_size] (fp8 only)

    def bind(self, attention_layers) -> None:
        """Point each attention layer at its views of the pool."""
        for i, attn in enumerate(attention_layers):
            if self.scales is None:
                attn.bind_kv_cache(self.kv[0, i], self.kv[1, i])
            else:
                attn.bind_kv_cache(self.kv[0, i], self.kv[1, i], self.scales[0, i], self.scales[1, i])


def bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, K and V (and their fp8 scales)."""
    per_token_head = model_config.head_dim * dtype.itemsize
    if dtype == torch.float8_e4m3fn:
        per_token_head += torch.float32.itemsize
    return 2 * model_config.num_hidden_layers * block_size * model_config.num_key_value_heads * per_token_head


def allocate_kv_cache(model_config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> KVCache:
    if num_blocks * block_size > MAX_SLOTS:
        raise ValueError(f"num_kv_blocks {num_blocks} x block_size {block_size} exceeds {MAX_SLOTS} cache slots")
    layers, heads = model_config.num_hidden_layers, model_config.num_key_value_heads
    # Zeroed, not empty: padded CUDA-graph rows attend over block 0, which must hold finite values.
    kv = torch.zeros(2, layers, num_blocks, block_size, heads, model_config.head_dim, dtype=dtype, device=device)
    # Head-major within a block: a kernel reading one head's tile reads its scales contiguously.
    scales = (torch.ones(2, layers, num_blocks, heads, block_size, dtype=torch.float32, device=device)
              if dtype == torch.float8_e4m3fn else None)
    return KVCache(num_blocks, block_size, kv, scales)


def num_blocks_from_gpu_memory(device: torch.device, gpu_memory_utilization: float, block_bytes: int,
                               activation_copies: int = 1) -> int:
    """Blocks that fit in total * utilization once the memory in use and the activation peak are set aside.

    Call right after a profiling forward pass of the largest step (its peak is in the allocator stats)
    with its temporaries freed: what is in use then is weights, CUDA context and other processes.
    activation_copies: how many times the peak is set aside (2: piecewise CUDA graphs keep their
    own pool and static buffers, at most one such step's worth, besides the eager steps').
    """
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    activation_peak = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
    budget = total * gpu_memory_utilization - (total - free) - activation_copies * activation_peak
    num_blocks = int(budget // block_bytes)
    if num_blocks < 1:
        raise ValueError(
            f"no GPU memory left for the KV cache: gpu_memory_utilization {gpu_memory_utilization} of "
            f"{total / 2**30:.1f} GiB, {(total - free) / 2**30:.1f} GiB in use, activation peak "
            f"{activation_peak / 2**30:.2f} GiB (set aside {activation_copies}x); raise gpu_memory_utilization "
            "or lower max_num_batched_tokens"
        )
    return num_blocks
