"""HF generate() behind Triton: the common Triton+PyTorch deployment that the llm model replaces.

A plain Python-backend model (backend "python", not decoupled), written the way such deployments
usually are: Triton's dynamic batcher hands execute() up to max_batch_size queued requests, they run
as one left-padded greedy `model.generate()` until the longest requested output is done, and each
request gets its single response at the end of its batch. No token streaming: TextIteratorStreamer
serves one sequence, so batching and streaming exclude each other in this setup, and a client's
time to first token is its whole batch's generation (that is the honest TTFT of this deployment).

Tensors as the llm model's (docs/llm_model.md), with Triton's batch dimension: `text_input`,
`stream` (accepted; one response regardless), `sampling_parameters` JSON (max_tokens, default 16;
temperature, only 0 = greedy; ignore_eos), `return_num_output_tokens`; outputs `text_output`
(generated text only), `num_output_tokens`, `finish_reason`. Parameter `model`: the HF folder.
Needs nothing beyond torch, transformers and numpy, so any PyTorch image runs it.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

# The 2.51 stub needs numpy < 2, and an image's SciPy and scikit-learn built for numpy 2 fail to
# import under it. transformers imports them only for features generate() does not use (assisted
# decoding, object-detection losses), so they are hidden here (find_spec then reports them missing).
for _numpy2_only in ("scipy", "sklearn"):
    sys.modules.setdefault(_numpy2_only, None)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = config["parameters"]["model"]["string_value"]
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        self.model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.pad_token_id is None:  # random and base checkpoints often have none
            self.tokenizer.pad_token_id = min(self.eos_ids) if self.eos_ids else 0
        self._generate([("warm-up", 2, True)])  # the first client does not pay for lazy init

    def execute(self, requests):
        responses: list = [None] * len(requests)
        batch, rows = [], []
        for i, request in enumerate(requests):
            try:
                batch.append(_parse(request))
                rows.append(i)
            except ValueError as exc:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        if batch:
            for i, (text, n_tokens, reason) in zip(rows, self._generate(batch)):
                responses[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_)),
                    pb_utils.Tensor("num_output_tokens", np.array([[n_tokens]], dtype=np.int32)),
                    pb_utils.Tensor("finish_reason", np.array([[reason.encode()]], dtype=np.object_))])
        return responses

    def _generate(self, batch):
        """[(prompt, max_tokens, ignore_eos)] -> [(text, tokens, finish_reason)], one generate() call."""
        enc = self.tokenizer([p for p, _, _ in batch], return_tensors="pt", padding=True).to(self.device)
        # EOS stays suppressed until every ignore_eos request has its tokens; others are cut at EOS.
        min_new = max((m for _, m, ignore in batch if ignore), default=0)
        with torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=max(m for _, m, _ in batch), min_new_tokens=min_new,
                                      do_sample=False, pad_token_id=self.tokenizer.pad_token_id)
        results = []
        for row, (_, max_tokens, ignore_eos) in zip(out[:, enc["input_ids"].shape[1]:].tolist(), batch):
            ids = row[:max_tokens]
            if not ignore_eos:
                ids = next((ids[:k] for k, t in enumerate(ids) if t in self.eos_ids), ids)
            reason = "length" if len(ids) == max_tokens else "stop"
            results.append((self.tokenizer.decode(ids, skip_special_tokens=True), len(ids), reason))
        return results


def _parse(request) -> tuple[str, int, bool]:
    prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0].decode()
    if not prompt:
        raise ValueError("input 'text_input' is empty")
    params_tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    params = json.loads(params_tensor.as_numpy().reshape(-1)[0]) if params_tensor is not None else {}
    if not isinstance(params, dict):
        raise ValueError(f"'sampling_parameters' must be a JSON object, got {type(params).__name__}")
    max_tokens = params.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"sampling_parameters.max_tokens must be an integer >= 1, got {max_tokens!r}")
    if params.get("temperature", 0) != 0:
        raise ValueError(f"sampling_parameters.temperature must be 0 (this baseline decodes greedily), "
                         f"got {params['temperature']!r}")
    return prompt, max_tokens, bool(params.get("ignore_eos", False))
