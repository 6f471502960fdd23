"""How many tokens an embed or rerank request holds, as the model's own tokenizer counts them: the
ensemble's first step (its tokenizer) run on the same inputs, its attention mask summed (the special
tokens included, each text cut where the model cuts it). Costs one more tokenization."""
from __future__ import annotations

import numpy as np

from ragstack.openai_frontend.triton import Triton


async def count(triton: Triton, model: str, inputs: dict[str, np.ndarray], params: dict[str, str]) -> int:
    config = await triton.config(model) or {}
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    if not steps or "attention_mask" not in steps[0].get("output_map", {}):
        return 0   # not a tokenizer-first ensemble: nothing to count with
    first = steps[0]
    step_inputs = {name: inputs[tensor] for name, tensor in first.get("input_map", {}).items()}
    outputs = await triton.infer(first["model_name"], step_inputs, params)
    return int(outputs["attention_mask"].sum())
