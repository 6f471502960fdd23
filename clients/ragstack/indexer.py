"""Build a retriever index version from a folder of documents, embedding through the running
server's `embed` model.

    read (documents.py) -> chunk in embedder tokens (chunking.py) -> embed what is new, in batches
    -> write version N+1 (index_store.py: FAISS, passages, BM25, manifest with the build report)

Idempotent: the new version's fingerprint (chunk ids, chunking settings, the tokenizer, the embed model,
the retrieval mode) is compared with the newest version's; when they are equal nothing is written.
Incremental: a chunk whose id the previous version holds (same document, same text) takes that
version's vector, so only new chunks are embedded. Neither can see inside the embed model: after
changing the embedder, build with force=True, which also embeds every chunk again.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ragstack import index_store
from ragstack.chunking import (DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS, ChunkReport, EmbedderTokenizer,
                               check_settings, chunk_documents)
from ragstack.documents import FileError, read_folder
from ragstack.launcher import ROOT

DEFAULT_MODEL_DIR = ROOT / "model_repository" / "retriever"
REPOSITORY = ROOT / "model_repository"
EMBED_BATCH = 32   # texts per embed request: the embed ensemble's limit
# The retrieval a new index serves by default: dense (FAISS cosine) or hybrid (dense and BM25 fused by
# reciprocal rank). Dense measured better on the project's evaluation set (docs/benchmarks.md, retrieval).
DEFAULT_RETRIEVAL = "dense"
MAX_REPORTED = 50   # warnings and errors listed in the manifest; the counts are exact


@dataclass(frozen=True)
class BuildResult:
    version: int
    created: bool          # False: the newest version already indexes exactly this
    documents: int
    chunks: int
    path: Path
    report: dict = field(default_factory=dict)   # what the build made and met: chunk lengths, cuts, errors, speed
    errors: list[FileError] = field(default_factory=list)


def fingerprint(chunk_ids: list[str], settings: dict) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for chunk_id in chunk_ids:
        digest.update(chunk_id.encode())
    return digest.hexdigest()


def embedder_tokenizer(client, path: str | Path | None = None) -> EmbedderTokenizer:
    """The tokenizer the served `embed_tokenizer` uses (its tokenizer_dir parameter, in this checkout's
    model repository), or the one at `path`."""
    if path is None:
        try:
            params = client.model_config("embed_tokenizer").get("parameters", {})
            path = REPOSITORY / params["tokenizer_dir"]["string_value"]
        except Exception:  # noqa: BLE001 - a server without it: the default embedder's
            path = REPOSITORY / "embedder" / "1"
        if not (Path(path) / "tokenizer.json").is_file():
            raise ValueError(f"{path}: the served embedder's tokenizer.json is not in this checkout; "
                             "give it with --tokenizer (a tokenizer.json or its folder)")
    return EmbedderTokenizer(path)


def embed_all(client, texts: list[str], batch: int = EMBED_BATCH, progress: bool = True) -> tuple[np.ndarray, int]:
    """The texts' embeddings, and how many the embedder truncated (0 when chunking is right)."""
    from tqdm import tqdm  # noqa: PLC0415

    vectors, truncated = [], 0
    with tqdm(total=len(texts), unit="chunk", desc="embedding", disable=not progress) as bar:
        for start in range(0, len(texts), batch):
            result = client.embed(texts[start:start + batch])
            vectors.append(result.vectors)
            truncated += sum(result.truncated)
            bar.update(len(vectors[-1]))
    return (np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)), truncated


def _previous(model_dir: Path, version: int | None, embed_model: str) -> tuple[dict[str, int], np.ndarray | None]:
    """Chunk id -> row, and the vectors, of the version whose embeddings a build may reuse: the one it
    replaces, else the newest; none when it was embedded by another embed model."""
    found = index_store.versions(model_dir)
    pick = version if version in found else (found[-1] if found else None)
    if pick is None:
        return {}, None
    current = index_store.read_manifest(model_dir, pick)
    if current.manifest.get("embed_model") != embed_model:
        return {}, None
    try:
        rows = {p.id: i for i, p in enumerate(index_store.load_passages(current.path))}
        vectors = index_store.load_vectors(current.path)
    except (OSError, RuntimeError, ValueError):   # a damaged version: embed everything
        return {}, None
    return (rows, vectors) if len(rows) == len(vectors) else ({}, None)


def build(folder: str | Path, client, model_dir: Path = DEFAULT_MODEL_DIR, *,
          chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
          version: int | None = None, force: bool = False, index_type: str = "auto",
          embed_model: str = "embed", progress: bool = True, tokenizer: str | Path | None = None,
          retrieval: str = DEFAULT_RETRIEVAL) -> BuildResult:
    """Index `folder` as version `version` (default: newest + 1) of the retriever in `model_dir`."""
    if retrieval not in index_store.RETRIEVAL_MODES:
        raise ValueError(f"retrieval {retrieval!r}: use one of {list(index_store.RETRIEVAL_MODES)}")
    started = time.monotonic()
    errors: list[FileError] = []
    documents = read_folder(folder, errors)
    embedder = embedder_tokenizer(client, tokenizer)
    check_settings(embedder, chunk_tokens, overlap_tokens)
    chunking = ChunkReport(embedder.max_length, chunk_tokens, overlap_tokens)
    chunks = chunk_documents(documents, embedder, chunk_tokens, overlap_tokens, chunking)
    if not chunks:
        failed = f" ({len(errors)} could not be read: {errors[0]}, ...)" if errors else ""
        raise ValueError(f"{folder}: no .txt, .md, .html or .pdf document with text in it{failed}")
    settings = {"chunk_tokens": chunk_tokens, "overlap_tokens": overlap_tokens, "tokenizer": embedder.digest,
                "embed": embed_model, "retrieval": retrieval}
    digest = fingerprint([c.id for c in chunks], settings)
    if version is None:
        current = index_store.latest(model_dir)
    else:
        current = index_store.read_manifest(model_dir, version) if version in index_store.versions(model_dir) else None
    if not force and current and current.manifest.get("fingerprint") == digest:
        return BuildResult(current.version, False, len(documents), len(chunks), current.path,
                           current.manifest.get("report", {}), errors)

    rows, old_vectors = ({}, None) if force else _previous(model_dir, version, embed_model)
    new = [i for i, c in enumerate(chunks) if c.id not in rows]
    embed_started = time.monotonic()
    fresh, truncated = embed_all(client, [chunks[i].text for i in new], progress=progress)
    embed_s = time.monotonic() - embed_started
    dim = fresh.shape[1] if len(new) else old_vectors.shape[1]
    vectors = np.zeros((len(chunks), dim), np.float32)
    if len(new):
        vectors[new] = fresh
    reused = [i for i, c in enumerate(chunks) if c.id in rows]
    if reused:
        vectors[reused] = old_vectors[[rows[chunks[i].id] for i in reused]]
    passages = [index_store.Passage(c.id, c.source, c.index, c.text, c.tokens, list(c.lines),
                                    list(c.pages) if c.pages else None) for c in chunks]
    newest = index_store.versions(model_dir)
    target = version if version is not None else (newest[-1] + 1 if newest else 1)
    report = {
        "documents": len(documents),
        "files_failed": len(errors),
        "errors": [str(e) for e in errors[:MAX_REPORTED]],
        **chunking.summary(),
        "cuts": [str(c) for c in chunking.cuts[:MAX_REPORTED]],
        "embedded": len(new), "reused": len(reused), "truncated_by_embedder": truncated,
        "embed_seconds": round(embed_s, 2),
        "chunks_per_s": round(len(new) / embed_s, 1) if len(new) and embed_s > 0 else None,
    }
    manifest = {
        "fingerprint": digest,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "folder": str(Path(folder).resolve()),
        "documents": len(documents),
        "chunking": {"chunk_tokens": chunk_tokens, "overlap_tokens": overlap_tokens,
                     "tokenizer": str(embedder.path), "tokenizer_sha256": embedder.digest,
                     "max_length": embedder.max_length},
        "embed_model": embed_model,
        "retrieval": retrieval,
    }
    written = index_store.write_version(model_dir, target, vectors, passages, {**manifest, "report": report},
                                        index_type)
    report["build_seconds"] = round(time.monotonic() - started, 2)
    return BuildResult(target, True, len(documents), len(chunks), written.path, report, errors)


def describe(report: dict) -> list[str]:
    """The build report in a few lines, for the CLI."""
    tokens = report.get("tokens", {})
    over = report.get("over_limit", 0)
    lines = [f"chunks: {report.get('chunks', 0):,} of {report.get('chunk_tokens')} embedder tokens at most "
             f"(overlap {report.get('overlap_tokens')}); tokens min {tokens.get('min')} / median {tokens.get('median')}"
             f" / p95 {tokens.get('p95')} / max {tokens.get('max')}; limit {report.get('limit')}: "
             f"{'none over' if not over else f'{over} OVER'}; {report.get('lines_cut', 0)} line(s) cut"]
    if "embedded" in report:
        speed = f", {report['chunks_per_s']:,.1f} chunks/s" if report.get("chunks_per_s") else ""
        lines.append(f"embedding: {report['embedded']:,} new chunk(s) in {report['embed_seconds']:.1f} s{speed}; "
                     f"{report['reused']:,} reused from the previous version; "
                     f"{report.get('truncated_by_embedder', 0)} truncated by the embedder")
    lines += [f"warning: {cut}" for cut in report.get("cuts", [])]
    if report.get("lines_cut", 0) > len(report.get("cuts", [])):
        lines.append(f"warning: ... and {report['lines_cut'] - len(report['cuts'])} more cut lines")
    return lines
