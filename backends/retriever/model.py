"""Python-based backend `retriever`: a query embedding -> the top_k passages of a FAISS index.

A Python-based backend rather than `<version>/model.py`, because index versions are model
versions: each version folder holds only built data (index.faiss, passages.jsonl, manifest.json,
format in ragstack.index_store), and `ragstack index build` adds version N+1 without code.

Inputs:  embedding FP32 [1, D] (unit length; normalised again here), top_k INT32 [1] (optional).
Outputs: passages, passage_ids, sources BYTES [k]; scores FP32 [k] (cosine), best first;
         k = min(top_k, passages in the index).
Parameters: default_top_k, max_top_k, hnsw_ef_search (HNSW indexes only).
"""
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from ragstack import index_store


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.default_top_k = int(params.get("default_top_k", "8"))
        self.max_top_k = int(params.get("max_top_k", "64"))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        ef_search = max(int(params.get("hnsw_ef_search", index_store.HNSW_EF_SEARCH)), self.max_top_k)
        self.index, passages = _load(version_dir, args["model_version"], ef_search)
        # Kept as numpy object arrays: a response is a fancy-indexing gather, no per-row Python.
        self.texts = np.array([p.text.encode() for p in passages], dtype=object)
        self.ids = np.array([p.id.encode() for p in passages], dtype=object)
        self.sources = np.array([p.source.encode() for p in passages], dtype=object)

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        try:
            query, top_k = self._parse(request)
        except ValueError as error:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        scores, rows = self.index.search(query, min(top_k, self.index.ntotal))
        keep = rows[0] >= 0  # HNSW may return -1 for slots it could not fill
        rows, scores = rows[0][keep], scores[0][keep]
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("passages", self.texts[rows]),
            pb_utils.Tensor("passage_ids", self.ids[rows]),
            pb_utils.Tensor("sources", self.sources[rows]),
            pb_utils.Tensor("scores", scores.astype(np.float32)),
        ])

    def _parse(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "embedding")
        if tensor is None:  # Triton 2.51 lets a required input go missing when a model has optional ones
            raise ValueError("embedding: missing input; send the query embedding [1, D]")
        embedding = tensor.as_numpy()
        if embedding.ndim != 2 or embedding.shape[0] != 1 or embedding.shape[1] != self.index.d:
            raise ValueError(f"embedding: shape {list(embedding.shape)}; expected [1, {self.index.d}] "
                             "(one query embedding of the index's dimension)")
        norm = float(np.linalg.norm(embedding))
        if not np.isfinite(norm) or norm == 0.0:
            raise ValueError(f"embedding: norm is {norm}; expected a finite, non-zero vector")
        top_k = self.default_top_k
        tensor = pb_utils.get_input_tensor_by_name(request, "top_k")
        if tensor is not None:
            values = tensor.as_numpy().reshape(-1)
            if values.size != 1:
                raise ValueError(f"top_k: {values.size} values; send one")
            top_k = int(values[0])
            if not 1 <= top_k <= self.max_top_k:
                raise ValueError(f"top_k: {top_k} is out of range; it must be 1 to {self.max_top_k}")
        return np.ascontiguousarray(embedding / norm, dtype=np.float32), top_k


def _load(version_dir: Path, version: str, ef_search: int):
    """The index and passages of one version folder. A missing or damaged file fails the load with
    a message naming it: the reason `ragstack models list` and the repository index show."""
    def failure(what: str) -> pb_utils.TritonModelException:
        return pb_utils.TritonModelException(f"retriever version {version}: {what}")

    rebuild = "rebuild it with `ragstack index build FOLDER`"
    if not (version_dir / index_store.MANIFEST_FILE).is_file():
        raise failure(f"no index in {version_dir}; build one with `ragstack index build FOLDER` "
                      "(or `ragstack build` for the sample corpus)")
    for name in (index_store.INDEX_FILE, index_store.PASSAGES_FILE):
        if not (version_dir / name).is_file():
            raise failure(f"{name} is missing from {version_dir} (an incomplete or damaged index build); {rebuild}")
    try:
        index = index_store.load_index(version_dir, ef_search)
    except RuntimeError as error:  # FAISS names its C++ function first: keep only what failed
        raise failure(f"{index_store.INDEX_FILE} in {version_dir} cannot be read "
                      f"({str(error).split('Error: ')[-1].strip()}); {rebuild}") from None
    passages = index_store.load_passages(version_dir)
    expected = index_store.read_manifest(version_dir.parent, int(version)).manifest.get("count")
    if not len(passages) == index.ntotal == expected:
        raise failure(f"{index_store.INDEX_FILE} holds {index.ntotal} vectors, {index_store.PASSAGES_FILE} "
                      f"{len(passages)} passages, the manifest says {expected}: the files are damaged or from "
                      f"different builds; {rebuild}")
    return index, passages
