"""The Llama decoder family: Llama 2/3/3.1, Mistral and Qwen2 differ only in config flags.

Parameter names mirror HF's, except the fused `qkv_proj` (q|k|v) and `mlp.gate_up_proj` (gate|up);
`packed_modules_mapping` tells the loader which checkpoint tensors fill them. With an FP8 plan
(`quant`, llm_engine/quantization.py) the decoder's projections hold e4m3 weights and their scales;
the embedding and the LM head keep the model dtype. Under tensor
parallelism the model is built from `ModelConfig.per_rank` (this rank's heads and MLP width) and
`tp`: attention and MLP split Megatron-style, the vocabulary split by the embedding and LM head.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from llm_engine import kernels
from llm_engine.model import ops
from llm_engine.model.layers.attention import Attention, AttentionMetadata
from llm_engine.model.layers.embedding import VocabEmbedding, compute_logits, vocab_rows_per_rank
from llm_engine.model.layers.linear import Linear
from llm_engine.model.layers.mlp import GatedMLP
from llm_engine.model.layers.norm import RMSNorm
from llm_engine.model.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear, shard_param
from llm_engine.model.layers.rotary_embedding import RotaryEmbedding
from llm_engine.worker.distributed import SINGLE, TensorParallelGroup

if TYPE_CHECKING:
    from llm_engine.model_config import ModelConfig
    from llm_engine.quantization import Fp8Quantization


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding, tp: TensorParallelGroup,
                 quant: Fp8Quantization | None = None, prefix: str = "self_attn") -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size

        def plan(*modules: str):
            return quant.for_module([f"{prefix}.{m}" for m in modules]) if quant else None

        self.qkv_proj = ColumnParallelLinear(config.hidden_size,
                                             {"q": self.q_size, "k": self.kv_size, "v": self.kv_size},
                                             bias=config.qkv_bias, tp=tp, quant=plan("q_proj", "k_proj", "v_proj"))
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, bias=config.o_proj_bias, tp=tp,
                                        quant=plan("o_proj"))
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim ** -0.5, rotary_emb)

    def project(self, positions: torch.Tensor, hidden: torch.Tensor, slot_mapping: torch.Tensor,
                q_out: torch.Tensor | None = None, norm: RMSNorm | None = None) -> torch.Tensor:
        """hidden [T, H] -> the rotated q [T, Hq, D] (into q_out); k and v go into the cache. With `norm`,
        hidden is the residual stream and the norm is fused into the projection (a step of few rows)."""
        if norm is None:
            qkv = self.qkv_proj(hidden)
        else:
            qkv = ops.skinny_linear(hidden, self.qkv_proj.weight, self.qkv_proj.bias, norm_weight=norm.weight,
                                    eps=norm.eps, weight_scale=self.qkv_proj.weight_scale)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # Views, not copies: the kernels take row strides.
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return self.attn.write_kv(positions, q, k, v, slot_mapping, q_out)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary_emb: RotaryEmbedding, tp: TensorParallelGroup,
                 quant: Fp8Quantization | None = None, prefix: str = "model.layers.0") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary_emb, tp, quant, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, tp, quant, f"{prefix}.mlp")

    def after_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The layer's attention output [T, Hq * D] -> its output [T, H]; residual updated in place
        (the residual add is fused into the next norm)."""
        attended = self.self_attn.o_proj(attn_out)
        return self.mlp(self.post_attention_layernorm.for_projection(self.mlp.gate_up_proj, attended, residual))

    def add_attention_and_mlp(self, attn_out: torch.Tensor, residual: torch.Tensor) -> None:
        """after_attention for a step of few rows on one rank, in three fused projections: o into the
        residual, norm + gate_up + the SwiGLU gate, down into the residual (in place)."""
        o_proj, mlp, norm = self.self_attn.o_proj, self.mlp, self.post_attention_layernorm
        ops.skinny_linear(attn_out, o_proj.weight, o_proj.bias, residual=residual, weight_scale=o_proj.weight_scale)
        activation = ops.skinny_linear(residual, mlp.gate_up_proj.weight, norm_weight=norm.weight, eps=norm.eps,
                                       weight_scale=mlp.gate_up_proj.weight_scale, swiglu=True)
        ops.skinny_linear(activation, mlp.down_proj.weight, residual=residual, weight_scale=mlp.down_proj.weight_scale)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_position: int, tp: TensorParallelGroup,
                 quant: Fp8Quantization | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, tp)
        rotary_emb = RotaryEmbedding(config.head_dim, max_position, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary_emb, tp, quant, f"model.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tp = tp

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def piece(self, i: int, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
              attn_out: torch.Tensor | None, residual: torch.Tensor | None,
              out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Piece i of the forward pass, between two attentions: 0 embeds and projects layer 0's q;
        1 .. L-1 finish layer i-1 from its attention output and project layer i's q; L finishes the
        last layer and norms. -> (layer i's rotated q [T, Hq, D], or the final hidden states [T, H];
        the residual). The residual is updated in place: piece 0 fills it from the embedding (a new
        tensor when None). `out`: where the result goes (a CUDA graph's static buffer)."""
        if i == 0:
            embedded = self.embed_tokens(input_ids)
            residual = embedded if residual is None else residual.copy_(embedded)
        fused = self.fuses(residual)
        layer = self.layers[i] if i < len(self.layers) else None  # the layer whose q this piece projects
        if i == 0:
            hidden = residual if fused else layer.input_layernorm.for_projection(layer.self_attn.qkv_proj, residual)
        elif fused:
            self.layers[i - 1].add_attention_and_mlp(attn_out, residual)
            if i == len(self.layers):
                return self.norm(residual, out=out), residual
            hidden = residual
        else:
            hidden = self.layers[i - 1].after_attention(attn_out, residual)
            if i == len(self.layers):
                return self.norm(hidden, residual, out=out)
            hidden = layer.input_layernorm.for_projection(layer.self_attn.qkv_proj, hidden, residual)
        return layer.self_attn.project(positions, hidden, slot_mapping, out,
                                       layer.input_layernorm if fused else None), residual

    def fuses(self, residual: torch.Tensor) -> bool:
        """Whether a step of these rows runs its projections with the norms, the SwiGLU gate and the
        residual adds fused in (kernels/skinny_linear.py): few rows, one rank (a row-parallel
        projection's all-reduce comes before its residual add); FP8 weights have their own max_rows."""
        weight_dtype = self.layers[0].self_attn.qkv_proj.weight.dtype
        return self.tp.size == 1 and kernels.fits_skinny_linear(residual, weight_dtype)

    def attend(self, i: int, q: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """Layer i's attention: its rotated q -> [T, Hq * D] (into `out`)."""
        return self.layers[i].self_attn.attn.attend(q, meta, out)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x, residual = self.piece(0, input_ids, positions, meta.slot_mapping, None, None)
        for i in range(len(self.layers)):
            x, residual = self.piece(i + 1, input_ids, positions, meta.slot_mapping, self.attend(i, x, meta), residual)
        return x


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
        "gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    }

    def __init__(self, config: ModelConfig, max_position: int, tp: TensorParallelGroup = SINGLE,
                 quant: Fp8Quantization | None = None) -> None:
        super().__init__()
        self.config = config
        self.tp = tp
        self.model = LlamaModel(config, max_position, tp, quant)
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

    @property
    def pieces(self) -> LlamaModel:
        """The forward pass in pieces between attentions (LlamaModel.piece / attend / num_pieces)."""
        return self.model

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [N, hidden] of the positions to sample -> float32 logits [N, vocab] on
        tensor-parallel rank 0, None on the other ranks."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return compute_logits(hidden, weight, self.config.vocab_size, self.tp)
