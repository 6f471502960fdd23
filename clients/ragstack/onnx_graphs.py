"""The torch modules that `ragstack.onnx_export` turns into the served ONNX graphs.

Every graph takes what the `tokenizer` backend produces — `input_ids`, `attention_mask`,
`token_type_ids`, int64 [N, S], right-padded — and returns float32 tensors:
  embedder        -> `embedding` [N, D]: mean pooling over real tokens (or the [CLS] token, as bge
                     pools), then L2 normalisation: sentence-transformers' Pooling + Normalize;
  cross-encoder   -> `scores` [N, 1]: the relevance logit of a *ForSequenceClassification model, and
                     `activated_scores` [N, 1]: the model's activation of it (sentence-transformers'
                     CrossEncoder.predict; a sigmoid unless the model names another);
  pair-cosine     -> `scores` and `activated_scores` [N, 1], both the cosine: a bi-encoder in the
                     cross-encoder interface (see PairCosineReranker), scored as vLLM scores one.
Each graph first drops the padding columns that no row of the batch uses, so requests padded to a
common bucket length (which lets Triton's dynamic batcher merge them) cost only what the longest
real text of the merged batch costs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def drop_common_padding(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Keep the first L columns, L = longest real row (inputs are right-padded; mask is tensors[1])."""
    # arange + index_select, not slicing: slicing by a tensor would be frozen to a constant in the trace.
    keep = torch.arange(tensors[1].sum(dim=1).max(), device=tensors[1].device)
    return tuple(t.index_select(1, keep) for t in tensors)


def mean_pool(hidden: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = weights.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class Embedder(nn.Module):
    POOLINGS = ("mean", "cls")

    def __init__(self, encoder: nn.Module, pooling: str):
        super().__init__()
        if pooling not in self.POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not supported; one of {self.POOLINGS}")
        self.encoder = encoder
        self.pooling = pooling

    def forward(self, input_ids, attention_mask, token_type_ids):
        input_ids, attention_mask, token_type_ids = drop_common_padding(input_ids, attention_mask, token_type_ids)
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        pooled = mean_pool(hidden, attention_mask) if self.pooling == "mean" else hidden[:, 0]
        return F.normalize(pooled, dim=-1)


class CrossEncoderScorer(nn.Module):
    def __init__(self, classifier: nn.Module, activation: nn.Module):
        super().__init__()
        if classifier.config.num_labels != 1:
            raise ValueError(f"a cross-encoder needs num_labels=1 (one relevance logit), got {classifier.config.num_labels}")
        self.classifier = classifier
        self.activation = activation

    def forward(self, input_ids, attention_mask, token_type_ids):
        input_ids, attention_mask, token_type_ids = drop_common_padding(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).logits
        return logits, self.activation(logits)


class PairCosineReranker(nn.Module):
    """Scores a cross-encoder input `[CLS] query [SEP] passage [SEP]` with a bi-encoder.

    The two segments (told apart by token_type_ids) are encoded in one pass but independently:
    a block-diagonal attention mask keeps each segment to itself, positions restart per segment and
    every token gets token type 0, as when the bi-encoder embeds a single text. The passage segment
    lacks its own leading [CLS]; one is appended as an extra column with position 0 — attention does
    not depend on column order, only on positions — so the passage segment is exactly
    `[CLS] passage [SEP]`. Score = cosine of the two mean-pooled segments, i.e. the embedder's
    query-passage cosine (pair truncation aside). It is not a trained cross-encoder.
    """

    def __init__(self, encoder: nn.Module, cls_token_id: int):
        super().__init__()
        self.encoder = encoder
        self.cls_token_id = cls_token_id

    def forward(self, input_ids, attention_mask, token_type_ids):
        input_ids, attention_mask, token_type_ids = drop_common_padding(input_ids, attention_mask, token_type_ids)
        one = torch.ones_like(input_ids[:, :1])
        ids = torch.cat([input_ids, one * self.cls_token_id], dim=1)
        valid = torch.cat([attention_mask, one], dim=1)
        passage = torch.cat([token_type_ids, one], dim=1) * valid  # 1 on passage tokens and the appended [CLS]
        query = (1 - passage) * valid
        # query tokens count from 0; passage tokens from 1, after the appended [CLS] at 0
        positions = torch.where(passage.bool(), passage.cumsum(1), query.cumsum(1) - 1)
        positions = torch.cat([positions[:, :-1], torch.zeros_like(one)], dim=1)
        same_segment = passage.unsqueeze(2) == passage.unsqueeze(1)
        allowed = same_segment & valid.bool().unsqueeze(1)
        # where(), not multiply: 0 * -inf would be NaN once an fp16 variant turns the minimum into -inf
        additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min).unsqueeze(1)
        hidden = self.encoder.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids), position_ids=positions)
        hidden = self.encoder.encoder(hidden, attention_mask=additive).last_hidden_state
        q = F.normalize(mean_pool(hidden, query), dim=-1)
        p = F.normalize(mean_pool(hidden, passage), dim=-1)
        cosine = (q * p).sum(dim=-1, keepdim=True)
        return cosine, cosine.clone()   # clone: a graph output named twice needs a node of its own
