"""Paged attention of one layer: rotate the step's q and k, write K/V into the cache (one kernel),
then attend over the cache. The two halves are separate calls, so that a piecewise CUDA graph
(piecewise_graphs.py) can hold the first and leave the second to run eagerly."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llm_engine.model import ops
from llm_engine.model.layers.rotary_embedding import RotaryEmbedding


@dataclass
class AttentionMetadata:
    """Per-step tensors, shared by every layer of the forward pass.

    A step with prefill chunks runs its leading `num_decodes` sequences (one new token each)
    through the decode kernel, which reads each KV head once for its whole GQA group, and the
    rest through the prefill kernel: a 1-token query in a prefill tile would waste the tile.
    """

    slot_mapping: torch.Tensor         # [T] cache slot (block * block_size + offset) of each new token; < 0: skip
    block_tables: torch.Tensor         # int32 [B, max_blocks] physical blocks of each sequence
    context_lens: torch.Tensor         # int32 [B] tokens in each sequence's context, this step's included
    cu_seqlens_q: torch.Tensor | None  # int32 [B - num_decodes + 1] query offsets of the prefill sequences,
                                       # from their first token; None: decode only
    num_decodes: int = 0               # leading one-token sequences of a step with prefill chunks


class Attention(nn.Module):
    """Holds this layer's slice of the KV pool; the model runner binds it with `bind_kv_cache`."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.rotary_emb = rotary_emb
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.k_cache = self.v_cache = None
        self.k_scale = self.v_scale = None

    def bind_kv_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
        self.k_cache, self.v_cache, self.k_scale, self.v_scale = k_cache, v_cache, k_scale, v_scale

    def write_kv(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slot_mapping: torch.Tensor, q_out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate q and k, write k and v into this layer's cache -> the rotated q (into q_out)."""
        return ops.rotary_and_write_kv(q, k, v, positions, self.rotary_emb.cos_sin_cache, self.k_cache,
                                       self.v_cache, slot_mapping, self.k_scale, self.v_scale, q_out=q_out)

    def attend(self, q: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """The rotated q [T, Hq, D] over the cache -> [T, Hq * D] (into `out` if given): the
        leading decodes and the prefill chunks each into their rows."""
        if out is None:
            out = torch.empty(q.shape[0], self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        rows = out.view(-1, self.num_heads, self.head_dim)
        if meta.cu_seqlens_q is None:
            self._decode(q, meta.block_tables, meta.context_lens, rows)
            return out
        d = meta.num_decodes
        ops.paged_prefill_attention(q[d:], self.k_cache, self.v_cache, meta.block_tables[d:], meta.cu_seqlens_q,
                                    meta.context_lens[d:], self.scale, self.k_scale, self.v_scale, out=rows[d:])
        if d:
            self._decode(q[:d], meta.block_tables[:d], meta.context_lens[:d], rows[:d])
        return out

    def _decode(self, q: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                out: torch.Tensor) -> torch.Tensor:
        return ops.paged_decode_attention(q, self.k_cache, self.v_cache, block_tables, context_lens, self.scale,
                                          self.k_scale, self.v_scale, out=out)
