"""Python-based backend `tokenizer`: text (BYTES) -> the int64 inputs of an ONNX encoder.

It is the first step of the `embed` and `rerank` ensembles. Tokenizing here, not inside the ONNX
model's backend, keeps the ONNX models plain id-in graphs that the native onnxruntime backend of
the nvcr.io image serves unchanged (docs/onnx_models.md). It uses the model's own tokenizer.json
(HF tokenizers), written by scripts/export_onnx.py with truncation at the model's limit.

Config: inputs `text` [-1] (single texts) or `query` [1] + `passages` [-1] (query-passage pairs);
outputs input_ids / attention_mask / token_type_ids [N, S] and `truncated` [N]. Parameters:
  tokenizer_dir       version folder holding tokenizer.json, relative to the model repository root
  max_texts           texts (passages) per request: the ONNX model's max_batch_size
  max_text_bytes      bytes per text: tokenizing costs ~1 us a byte even when the result is
                      truncated, so a longer text is refused rather than tokenized
  pad_to_multiple_of  requests are padded to a multiple of this, so that requests of one bucket
                      have one shape and the dynamic batcher can merge them
"""
import faulthandler
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config["parameters"].items()}
        path = Path(args["model_repository"]).parent / params["tokenizer_dir"] / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.enable_padding(**{**self.tokenizer.padding, "pad_to_multiple_of": int(params["pad_to_multiple_of"])})
        self.max_texts = int(params["max_texts"])
        self.max_text_bytes = int(params["max_text_bytes"])
        self.pairs = [tensor["name"] for tensor in config["input"]] == ["query", "passages"]

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        try:
            encodings = self._encode(request)
        except ValueError as error:  # the client's mistake: INVALID_ARG, and the model keeps serving
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("input_ids", np.array([e.ids for e in encodings], dtype=np.int64)),
            pb_utils.Tensor("attention_mask", np.array([e.attention_mask for e in encodings], dtype=np.int64)),
            pb_utils.Tensor("token_type_ids", np.array([e.type_ids for e in encodings], dtype=np.int64)),
            pb_utils.Tensor("truncated", np.array([bool(e.overflowing) for e in encodings])),
        ])

    def _encode(self, request):
        if self.pairs:
            (query,) = self._texts(request, "query", 1)
            return self.tokenizer.encode_batch([(query, passage) for passage in self._texts(request, "passages", self.max_texts)])
        return self.tokenizer.encode_batch(self._texts(request, "text", self.max_texts))

    def _texts(self, request, name, most):
        values = pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)
        if not 1 <= len(values) <= most:
            raise ValueError(f"{name}: {len(values)} texts in the request; send 1 to {most}")
        texts = []
        for i, value in enumerate(values):
            if len(value) > self.max_text_bytes:
                raise ValueError(f"{name}[{i}] is {len(value)} bytes; the limit is {self.max_text_bytes}")
            try:
                text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError:
                raise ValueError(f"{name}[{i}] is not valid UTF-8") from None
            if not text.strip():
                raise ValueError(f"{name}[{i}] is empty; every text needs at least one non-blank character")
            texts.append(text)
        return texts
