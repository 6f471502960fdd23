"""The on-disk format of one retriever index version, shared by the indexer (writes) and the
`retriever` backend (reads).

A version folder `model_repository/retriever/<N>/` holds:
  index.faiss     FAISS index over L2-normalised embeddings, inner product (= cosine); row i is passage i
  passages.jsonl  one JSON object per row: {"id", "source", "chunk", "text", "tokens", "lines", "pages"}
                  (versions built before token chunking have the first four only)
  manifest.json   what was indexed and how: fingerprint, counts, dimension, index type, chunking, embedder,
                  retrieval ("dense" or "hybrid": the index's default), the build report
  bm25/           a BM25 index of the same rows (bm25s), for hybrid retrieval; absent in older versions

Index type: an exact IndexFlatIP below HNSW_MIN_VECTORS vectors, IndexHNSWFlat (inner product)
from there. A flat scan of 50,000 x 384 floats is ~19 M multiply-adds per query, a few ms on
one core; beyond that the scan grows linearly while HNSW stays well under a millisecond, at the
price of approximate results (recall ~0.99 with the efSearch below) and ~256 extra bytes per vector.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

INDEX_FILE = "index.faiss"
PASSAGES_FILE = "passages.jsonl"
MANIFEST_FILE = "manifest.json"
HNSW_MIN_VECTORS = 50_000
HNSW_M = 32                   # graph neighbours per node
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 128          # >= the retriever's max top_k, so a search can return every slot


BM25_DIR = "bm25"
RETRIEVAL_MODES = ("dense", "hybrid")


@dataclass(frozen=True)
class Passage:
    id: str        # stable chunk id (chunking.chunk_id)
    source: str    # document path relative to the indexed folder
    chunk: int     # chunk index within the document
    text: str
    tokens: int | None = None          # embedder tokens, special tokens included
    lines: list[int] | None = None     # [first, last] line of the document's text
    pages: list[int] | None = None     # [first, last] page (PDF)

    def location(self) -> dict:
        """Where in its document the passage is: {"chunk", "lines"?, "pages"?}."""
        where = {"chunk": self.chunk}
        if self.lines:
            where["lines"] = list(self.lines)
        if self.pages:
            where["pages"] = list(self.pages)
        return where


@dataclass
class IndexVersion:
    version: int
    path: Path
    manifest: dict


def make_index(vectors: np.ndarray, index_type: str = "auto"):
    """A FAISS inner-product index holding `vectors` (normalised here)."""
    import faiss  # noqa: PLC0415 - heavy import, only for building and serving

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    faiss.normalize_L2(vectors)
    if index_type == "auto":
        index_type = "hnsw" if len(vectors) >= HNSW_MIN_VECTORS else "flat"
    if index_type == "flat":
        index = faiss.IndexFlatIP(vectors.shape[1])
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(vectors.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        raise ValueError(f"index type {index_type!r}: use auto, flat or hnsw")
    index.add(vectors)
    return index, index_type


def versions(model_dir: Path) -> list[int]:
    """Index versions present (numbered folders with a manifest), ascending."""
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir()
                  if p.is_dir() and p.name.isdigit() and (p / MANIFEST_FILE).is_file())


def read_manifest(model_dir: Path, version: int) -> IndexVersion:
    path = model_dir / str(version)
    return IndexVersion(version, path, json.loads((path / MANIFEST_FILE).read_text()))


def latest(model_dir: Path) -> IndexVersion | None:
    found = versions(model_dir)
    return read_manifest(model_dir, found[-1]) if found else None


BM25_STOPWORDS = "en"


def bm25_tokens(texts: list[str]) -> list[list[str]]:
    """Words for BM25, the same for passages and queries: lower case, 2+ word characters, no English
    stop words (identifiers such as `__init__` or `removeprefix` stay whole)."""
    import bm25s  # noqa: PLC0415

    return bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, return_ids=False, show_progress=False)


def write_bm25(folder: Path, texts: list[str]) -> None:
    import bm25s  # noqa: PLC0415

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, show_progress=False), show_progress=False)
    retriever.save(str(folder / BM25_DIR), show_progress=False)


def load_bm25(version_dir: Path):
    """The version's BM25 index (bm25s), or None for a version built without one."""
    if not (version_dir / BM25_DIR).is_dir():
        return None
    import bm25s  # noqa: PLC0415

    return bm25s.BM25.load(str(version_dir / BM25_DIR), show_progress=False)


def load_vectors(version_dir: Path) -> np.ndarray:
    """The version's stored embeddings (unit length), row i for passage i: an incremental build reuses them."""
    index = load_index(version_dir)
    return index.reconstruct_n(0, index.ntotal)


def write_version(model_dir: Path, version: int, vectors: np.ndarray, passages: list[Passage],
                  manifest: dict, index_type: str = "auto", bm25: bool = True) -> IndexVersion:
    """Write version `version` atomically: built in a staging folder, then renamed into place.

    Triton ignores the staging folder (not a number), so a poll or load never sees half a version.
    An existing folder of that version is replaced.
    """
    import faiss  # noqa: PLC0415

    if len(vectors) != len(passages):
        raise ValueError(f"{len(vectors)} vectors for {len(passages)} passages")
    index, index_type = make_index(vectors, index_type)
    staging = model_dir / f".staging-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        faiss.write_index(index, str(staging / INDEX_FILE))
        with open(staging / PASSAGES_FILE, "w", encoding="utf-8") as out:
            for passage in passages:
                row = {k: v for k, v in asdict(passage).items() if v is not None}
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
        if bm25:
            write_bm25(staging, [p.text for p in passages])
        manifest = {**manifest, "version": version, "count": len(passages), "dim": int(vectors.shape[1]),
                    "index_type": index_type}
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        final = model_dir / str(version)
        if final.exists():
            old = model_dir / f".replaced-{version}-{os.getpid()}"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old)
        else:
            staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return IndexVersion(version, final, manifest)


def load_passages(version_dir: Path) -> list[Passage]:
    with open(version_dir / PASSAGES_FILE, encoding="utf-8") as lines:
        return [Passage(**json.loads(line)) for line in lines]


def load_index(version_dir: Path, ef_search: int = HNSW_EF_SEARCH):
    """The FAISS index of a version folder; HNSW gets its search breadth set to `ef_search`."""
    import faiss  # noqa: PLC0415

    index = faiss.read_index(str(version_dir / INDEX_FILE))
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search
    return index
