"""rag_rerank: the rag pipeline's rerank step, query + retrieved passages -> scores [k, 1].

The default reranker (reranker/1, pair-cosine) scores a pair as the cosine of the embedder's
embeddings of the query and of the passage: exactly the retriever's score, which it computed from
the index's stored passage embeddings. Re-encoding every passage per query only to repeat it was
~0.4 s of a 0.66 s query on 2 CPU cores, so while that reranker is served its scores are the
retriever's. Any other reranker (a cross-encoder) is called through the `rerank` ensemble.

BLS, not an ensemble step: which one applies depends on the reranker version being served, and an
ensemble cannot choose a step at request time. The served version is the newest of the model's
version folders that Triton reports ready; its export.json (scripts/export_onnx.py) tells its kind
and source model. A version without one, or loaded from elsewhere, goes through `rerank`.
"""
import faulthandler
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.root = Path(args["model_repository"]).parent
        self.rerank = params.get("rerank_model", "rerank")
        self.reranker = params.get("reranker_model", "reranker")
        self.embedder = params.get("embedder_model", "embedder")

    def execute(self, requests):
        cosine = self._reranker_is_the_embedder_cosine()
        return [self._retrieval_scores(r) if cosine else self._rerank(r) for r in requests]

    def _reranker_is_the_embedder_cosine(self):
        reranker, embedder = self._served_export(self.reranker), self._served_export(self.embedder)
        return (reranker is not None and embedder is not None and reranker.get("kind") == "pair-cosine"
                and reranker.get("source") == embedder.get("source"))

    def _served_export(self, model):
        """export.json of the model's newest ready version folder; None without one."""
        folder = self.root / model
        versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True) \
            if folder.is_dir() else []
        for version in versions:
            if pb_utils.is_model_ready(model, str(version)):
                record = folder / str(version) / "export.json"
                return json.loads(record.read_text()) if record.is_file() else None
        return None

    @staticmethod
    def _retrieval_scores(request):
        scores = pb_utils.get_input_tensor_by_name(request, "retrieval_scores").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("scores", scores.reshape(-1, 1).astype(np.float32))])

    def _rerank(self, request):
        inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("query", "passages")]
        response = pb_utils.InferenceRequest(model_name=self.rerank, inputs=inputs,
                                             requested_output_names=["scores"]).exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        return pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "scores")])
