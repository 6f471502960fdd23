"""The Llama decoder family: Llama 2/3/3.1, Mistral and Qwen2 differ only in config flags.

Parameter names mirror HF's, except the fused `qkv_proj` (q|k|v) and `mlp.gate_up_proj` (gate|up);
`packed_modules_mapping` tells the loader which checkpoint tensors fill them. Under tensor
parallelism the model is built from `ModelConfig.per_rank` (this rank's heads and MLP width) and
`tp`: attention and MLP split Megatron-style, the vocabulary split by the embedding and LM head.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from llm_engine.distributed import SINGLE, TensorParallelGroup
from llm_engine.layers.attention import Attention, AttentionMetadata
from llm_engine.layers.embedding import VocabEmbedding, compute_logits, vocab_rows_per_rank
from llm_engine.layers.linear import Linear
from llm_engine.layers.mlp import GatedMLP
from llm_engine.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear, shard_param
from llm_engine.layers.norm import RMSNorm
from llm_engine.layers.rotary_embedding import RotaryEmbedding

if TYPE_CHECKING:
    from llm_engine.model_config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = ColumnParallelLinear(config.hidden_size,
                                             {"q": self.q_size, "k": self.kv_size, "v": self.kv_size},
                                             bias=config.qkv_bias, tp=tp)
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, bias=config.o_proj_bias, tp=tp)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5, rotary_emb)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Views, not copies: the kernels take row strides.
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(positions, q, k, v, meta))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary_emb, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, tp)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual add is fused into the next norm: each norm returns (normed, new residual).
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int, tp: TensorParallelGroup) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, tp)
        rotary_emb = RotaryEmbedding(config.head_dim, max_position, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary_emb, tp)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
        "gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    }

    def __init__(self, config: ModelConfig, max_position: int, tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.model = LlamaModel(config, max_position, tp)
        if config.tie_word_embeddings:
            # The LM head reads the embedding matrix; a checkpoint may still carry a copy of it.
            self.lm_head = None
            self.tied_checkpoint_tensors = ("lm_head.weight",)
        else:  # split over the vocabulary as the embedding is
            self.lm_head = Linear(config.hidden_size, vocab_rows_per_rank(config.vocab_size, tp))
            shard_param(self.lm_head.weight, 0, tp, padded=True)

    @property
    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Token ids [T] at positions [T] -> final hidden states [T, hidden]."""
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, hidden] of the positions to sample -> float32 logits [N, vocab] on
        tensor-parallel rank 0, None on the other ranks."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return compute_logits(hidden, weight, self.config.vocab_size, self.tp)
