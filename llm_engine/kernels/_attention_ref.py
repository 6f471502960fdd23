"""Plain-torch attention of one sequence's queries over its paged KV, shared by the references."""
from __future__ import annotations

import torch

from llm_engine.kernels.kv_store import gather_kv_ref


def attend_paged_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
) -> torch.Tensor:
    """q [n, Hq, D]: the last n positions of a context of context_len tokens; causal; float32 out."""
    num_queries = q.shape[0]
    if num_queries > context_len:
        raise ValueError(f"a sequence has {num_queries} queries but context_len {context_len}")
    k = gather_kv_ref(k_cache, k_scale, block_table, context_len)
    v = gather_kv_ref(v_cache, v_scale, block_table, context_len)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_positions = torch.arange(context_len - num_queries, context_len, device=q.device)
    kv_positions = torch.arange(context_len, device=q.device)
    scores.masked_fill_(kv_positions[None, None, :] > q_positions[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
