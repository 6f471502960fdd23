"""How many tokens each text of an embed or rerank request holds (a rerank model's: each query-passage
pair), as the model's own tokenizer counts them: the ensemble's first step (its tokenizer) run on the same
inputs, its attention mask summed per row (the special tokens included, each text cut where the model cuts
it). Costs one more tokenization."""
from __future__ import annotations

import numpy as np

from ragstack.openai_frontend.triton import Triton


async def counts(triton: Triton, model: str, inputs: dict[str, np.ndarray],
                 params: dict[str, str]) -> np.ndarray | None:
    """None for a model whose first step is no tokenizer: nothing to count with."""
    config = await triton.config(model) or {}
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    if not steps or "attention_mask" not in steps[0].get("output_map", {}):
        return None
    first = steps[0]
    step_inputs = {name: inputs[tensor] for name, tensor in first.get("input_map", {}).items()}
    outputs = await triton.infer(first["model_name"], step_inputs, params)
    return outputs["attention_mask"].sum(axis=1)
