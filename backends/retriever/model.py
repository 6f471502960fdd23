"""Python-based backend `retriever`: a query embedding -> the top_k passages of a FAISS index.

A Python-based backend rather than `<version>/model.py`, because index versions are model
versions: each version folder holds only built data (index.faiss, passages.jsonl, manifest.json,
format in ragstack.index_store), and `ragstack index build` adds version N+1 without code.

Inputs:  embedding FP32 [1, D] (unit length; normalised again here); optional top_k INT32 [1], query
         BYTES [1] (the question's text, for BM25), mode BYTES [1] ("dense" or "hybrid"; default: the
         index's, its manifest's `retrieval`).
Outputs: passages, passage_ids, sources BYTES [k]; scores FP32 [k], best first; locations BYTES [k]
         (JSON {"chunk", "lines", "pages"}: where in its document each passage is);
         k = min(top_k, passages in the index).
Parameters: default_top_k, max_top_k, hnsw_ef_search (HNSW indexes only), fusion_depth, rrf_k.

Dense: FAISS inner product over unit vectors, `scores` the cosine. Hybrid: the dense and the BM25
(bm25s) rankings, `fusion_depth` deep each, fused by reciprocal rank, score(d) = sum over the two
rankings of 1 / (rrf_k + rank of d); `scores` are those fused scores. Hybrid needs the query's text
and an index built with its BM25 folder.
"""
import faulthandler
import json
from pathlib import Path

import faiss
import numpy as np
import triton_python_backend_utils as pb_utils

from ragstack import index_store

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.default_top_k = int(params.get("default_top_k", "8"))
        self.max_top_k = int(params.get("max_top_k", "64"))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        ef_search = max(int(params.get("hnsw_ef_search", index_store.HNSW_EF_SEARCH)), self.max_top_k)
        self.fusion_depth = int(params.get("fusion_depth", "50"))
        self.rrf_k = float(params.get("rrf_k", "60"))
        self.index, passages = _load(version_dir, args["model_version"], ef_search)
        # A request searches one query, which faiss runs on one thread anyway; its other OpenMP threads
        # would only wake and spin after each search, taking cores from the llm's engine beside it.
        faiss.omp_set_num_threads(1)
        # Kept as numpy object arrays: a response is a fancy-indexing gather, no per-row Python.
        self.texts = np.array([p.text.encode() for p in passages], dtype=object)
        self.ids = np.array([p.id.encode() for p in passages], dtype=object)
        self.sources = np.array([p.source.encode() for p in passages], dtype=object)
        self.locations = np.array([json.dumps(p.location()).encode() for p in passages], dtype=object)
        self.bm25 = index_store.load_bm25(version_dir)
        manifest = index_store.read_manifest(version_dir.parent, int(args["model_version"])).manifest
        self.default_mode = manifest.get("retrieval", "dense")
        if self.default_mode == "hybrid" and self.bm25 is None:
            raise pb_utils.TritonModelException(
                f"retriever version {args['model_version']}: the manifest asks for hybrid retrieval but "
                f"{index_store.BM25_DIR}/ is missing; rebuild it with `ragstack index build FOLDER`")

    def execute(self, requests):
        return [self._respond(request) for request in requests]

    def _respond(self, request):
        try:
            query, top_k = self._parse(request)
            text, mode = self._text_and_mode(request)
        except ValueError as error:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        if mode == "hybrid":
            rows, scores = self._hybrid(query, text, top_k)
        else:
            rows, scores = self._dense(query, min(top_k, self.index.ntotal))
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("passages", self.texts[rows]),
            pb_utils.Tensor("passage_ids", self.ids[rows]),
            pb_utils.Tensor("sources", self.sources[rows]),
            pb_utils.Tensor("scores", scores.astype(np.float32)),
            pb_utils.Tensor("locations", self.locations[rows]),
        ])

    def _dense(self, query, k):
        scores, rows = self.index.search(query, k)
        keep = rows[0] >= 0  # HNSW may return -1 for slots it could not fill
        return rows[0][keep], scores[0][keep]

    def _hybrid(self, query, text, top_k):
        depth = min(max(self.fusion_depth, top_k), self.index.ntotal)
        fused: dict[int, float] = {}
        dense_rows, _ = self._dense(query, depth)
        results = self.bm25.retrieve(index_store.bm25_tokens([text]), k=depth, show_progress=False, n_threads=1)
        bm25_rows = [int(r) for r, s in zip(results.documents[0], results.scores[0]) if s > 0]
        for ranking in (dense_rows.tolist(), bm25_rows):
            for rank, row in enumerate(ranking, 1):
                fused[int(row)] = fused.get(int(row), 0.0) + 1.0 / (self.rrf_k + rank)
        best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        return (np.array([r for r, _ in best], dtype=np.int64),
                np.array([s for _, s in best], dtype=np.float32))

    def _text_and_mode(self, request):
        mode, text = self.default_mode, None
        tensor = pb_utils.get_input_tensor_by_name(request, "mode")
        if tensor is not None:
            mode = _one_text(tensor, "mode") or self.default_mode
            if mode not in index_store.RETRIEVAL_MODES:
                raise ValueError(f"mode: {mode!r} is not one of {list(index_store.RETRIEVAL_MODES)}")
        if mode == "hybrid":
            if self.bm25 is None:
                raise ValueError("mode: 'hybrid' needs an index with BM25 (built by this version of `ragstack index "
                                 "build`); this index has none")
            tensor = pb_utils.get_input_tensor_by_name(request, "query")
            text = _one_text(tensor, "query") if tensor is not None else ""
            if not text.strip():
                raise ValueError("query: hybrid retrieval needs the question's text; send `query` with the embedding")
        return text, mode

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


def _one_text(tensor, name: str) -> str:
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"{name}: {values.size} values; send one")
    value = values[0]
    try:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not valid UTF-8") from None


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
