"""`ragstack index build` through the running server: a new retriever version only when the corpus changed."""
from __future__ import annotations

import os

import pytest

from ragstack import index_store, indexer
from ragstack.client import RagClient


@pytest.mark.server
def test_reindexing_is_idempotent(tmp_path, triton_server):
    corpus, model_dir = tmp_path / "corpus", tmp_path / "retriever"
    corpus.mkdir()
    (corpus / "a.md").write_text("Triton batches requests on the server. " * 30)
    (corpus / "b.txt").write_text("FAISS searches vectors by inner product.")
    with RagClient(triton_server.grpc_url) as client:
        first = indexer.build(corpus, client, model_dir, progress=False)
        assert (first.version, first.created, first.documents) == (1, True, 2)
        manifest = first.path / index_store.MANIFEST_FILE
        stamp = manifest.stat().st_mtime_ns

        again = indexer.build(corpus, client, model_dir, progress=False)
        assert (again.version, again.created) == (1, False)
        assert manifest.stat().st_mtime_ns == stamp and index_store.versions(model_dir) == [1]

        (corpus / "b.txt").write_text("FAISS searches vectors by inner product, exactly or with HNSW.")
        changed = indexer.build(corpus, client, model_dir, progress=False)
        assert (changed.version, changed.created) == (2, True)
        assert index_store.versions(model_dir) == [1, 2]

        forced = indexer.build(corpus, client, model_dir, force=True, progress=False)
        assert (forced.version, forced.created) == (3, True)
    passages = index_store.load_passages(changed.path)
    assert [p.source for p in passages] == ["a.md", "a.md", "b.txt"]
    assert os.path.getsize(changed.path / index_store.INDEX_FILE) > 0
