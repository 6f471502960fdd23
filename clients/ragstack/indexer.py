"""Build a retriever index version from a folder of documents, embedding through the running
server's `embed` model.

    read (documents.py) -> chunk (chunking.py) -> embed, in batches -> write version N+1 (index_store.py)

Idempotent: the new version's fingerprint (chunk ids, chunking settings, embed model) is compared
with the newest version's; when they are equal nothing is written. The fingerprint does not see
inside the embed model: after changing the embedder, build with force=True.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ragstack import index_store
from ragstack.chunking import DEFAULT_CHUNK_WORDS, DEFAULT_OVERLAP_WORDS, chunk_documents
from ragstack.documents import read_folder
from ragstack.launcher import ROOT

DEFAULT_MODEL_DIR = ROOT / "model_repository" / "retriever"
EMBED_BATCH = 32   # texts per embed request: the embed ensemble's limit


@dataclass(frozen=True)
class BuildResult:
    version: int
    created: bool          # False: the newest version already indexes exactly this
    documents: int
    chunks: int
    path: Path


def fingerprint(chunk_ids: list[str], chunk_words: int, overlap_words: int, embed_model: str) -> str:
    settings = json.dumps({"chunk_words": chunk_words, "overlap_words": overlap_words, "embed": embed_model})
    digest = hashlib.sha256(settings.encode())
    for chunk_id in chunk_ids:
        digest.update(chunk_id.encode())
    return digest.hexdigest()


def embed_all(client, texts: list[str], batch: int = EMBED_BATCH, progress: bool = True) -> np.ndarray:
    from tqdm import tqdm  # noqa: PLC0415

    vectors = []
    with tqdm(total=len(texts), unit="chunk", desc="embedding", disable=not progress) as bar:
        for start in range(0, len(texts), batch):
            vectors.append(client.embed(texts[start:start + batch]).vectors)
            bar.update(len(vectors[-1]))
    return np.concatenate(vectors)


def build(folder: str | Path, client, model_dir: Path = DEFAULT_MODEL_DIR, *,
          chunk_words: int = DEFAULT_CHUNK_WORDS, overlap_words: int = DEFAULT_OVERLAP_WORDS,
          version: int | None = None, force: bool = False, index_type: str = "auto",
          embed_model: str = "embed", progress: bool = True) -> BuildResult:
    """Index `folder` as version `version` (default: newest + 1) of the retriever in `model_dir`."""
    documents = read_folder(folder)
    chunks = chunk_documents(documents, chunk_words, overlap_words)
    if not chunks:
        raise ValueError(f"{folder}: no .txt, .md or .html document with text in it")
    digest = fingerprint([c.id for c in chunks], chunk_words, overlap_words, embed_model)
    if version is None:
        current = index_store.latest(model_dir)
    else:
        current = index_store.read_manifest(model_dir, version) if version in index_store.versions(model_dir) else None
    if not force and current and current.manifest.get("fingerprint") == digest:
        return BuildResult(current.version, False, len(documents), len(chunks), current.path)

    vectors = embed_all(client, [c.text for c in chunks], progress=progress)
    passages = [index_store.Passage(c.id, c.source, c.index, c.text) for c in chunks]
    newest = index_store.versions(model_dir)
    target = version if version is not None else (newest[-1] + 1 if newest else 1)
    manifest = {
        "fingerprint": digest,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "folder": str(Path(folder).resolve()),
        "documents": len(documents),
        "chunking": {"chunk_words": chunk_words, "overlap_words": overlap_words},
        "embed_model": embed_model,
    }
    written = index_store.write_version(model_dir, target, vectors, passages, manifest, index_type)
    return BuildResult(target, True, len(documents), len(chunks), written.path)
