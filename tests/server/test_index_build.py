"""`ragstack index build` through the running server: a new retriever version only when the corpus changed,
only new chunks embedded, the report's counts, and the served index's hybrid retrieval and locations."""
from __future__ import annotations

import os
import shutil

import pytest

from model_states import wait_until_settled
from pdf_files import pdf_bytes
from ragstack import index_store, indexer
from ragstack.cli import main
from ragstack.client import RagClient, RagstackError
from ragstack.launcher import ROOT

pytestmark = pytest.mark.server
MODEL_DIR = ROOT / "model_repository" / "retriever"


def test_reindexing_is_idempotent_and_incremental(tmp_path, triton_server):
    corpus, model_dir = tmp_path / "corpus", tmp_path / "retriever"
    corpus.mkdir()
    (corpus / "a.md").write_text("Triton batches requests on the server. " * 60)
    (corpus / "b.txt").write_text("FAISS searches vectors by inner product.")
    with RagClient(triton_server.grpc_url) as client:
        first = indexer.build(corpus, client, model_dir, progress=False)
        assert (first.version, first.created, first.documents) == (1, True, 2)
        report = first.report
        assert report["over_limit"] == 0 and report["tokens"]["max"] <= 192 and report["truncated_by_embedder"] == 0
        assert report["embedded"] == first.chunks >= 3 and report["reused"] == 0 and report["chunks_per_s"] > 0
        assert report["lines_cut"] == 1 and report["cuts"][0].startswith("a.md: line 1 (")
        manifest = first.path / index_store.MANIFEST_FILE
        stamp = manifest.stat().st_mtime_ns

        again = indexer.build(corpus, client, model_dir, progress=False)
        assert (again.version, again.created) == (1, False)
        assert manifest.stat().st_mtime_ns == stamp and index_store.versions(model_dir) == [1]

        (corpus / "b.txt").write_text("FAISS searches vectors by inner product, exactly or with HNSW.")
        (corpus / "c.pdf").write_bytes(pdf_bytes([["Paged attention stores the KV cache in blocks."], ["Page two."]]))
        (corpus / "d.pdf").write_bytes(b"%PDF-1.4 damaged")
        changed = indexer.build(corpus, client, model_dir, progress=False)
        assert (changed.version, changed.created) == (2, True)
        assert (changed.report["embedded"], changed.report["reused"]) == (2, first.chunks - 1)   # b.txt and c.pdf
        assert [str(e) for e in changed.errors] == ["d.pdf: cannot read the PDF (PdfStreamError: Stream has ended "
                                                    "unexpectedly)"] and changed.report["files_failed"] == 1
        assert index_store.versions(model_dir) == [1, 2]
        # the reused vectors are the ones the embedder gives
        passages = index_store.load_passages(changed.path)
        vectors = index_store.load_vectors(changed.path)
        fresh = client.embed([passages[0].text]).vectors[0]
        assert float(vectors[0] @ fresh) > 0.99999

        forced = indexer.build(corpus, client, model_dir, force=True, progress=False)
        assert (forced.version, forced.created, forced.report["reused"]) == (3, True, 0)
    assert [p.source for p in passages].count("b.txt") == 1 and passages[-1].source == "c.pdf"
    assert passages[-1].location() == {"chunk": 0, "lines": [1, 3], "pages": [1, 2]}
    assert os.path.getsize(changed.path / index_store.INDEX_FILE) > 0


def test_the_cli_prints_the_report(tmp_path, triton_server, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("one line\n" * 20)
    (corpus / "bad.pdf").write_bytes(b"not a pdf")
    code = main(["index", "build", str(corpus), "--url", triton_server.grpc_url, "--model-dir", str(tmp_path / "r"),
                 "--chunk-tokens", "64", "--overlap-tokens", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "wrote version 1: 1 documents" in out and "limit 256: none over; 0 line(s) cut" in out
    assert "chunks/s" in out and "error: bad.pdf: cannot read the PDF" in err


def test_a_served_index_retrieves_dense_or_hybrid_with_locations(tmp_path, triton_server):
    """An index built with --retrieval hybrid serves BM25 fused with dense; `mode` picks either per request."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in {"codes.md": "Error E4711 means the flux capacitor overheated.\nReset it with flux-reset.",
                       "cats.md": "Cats sleep most of the day.\nThey purr when content.",
                       "tea.md": "Green tea is brewed below boiling.\nBlack tea takes boiling water."}.items():
        (corpus / name).write_text(text)
    before = index_store.versions(MODEL_DIR)
    with RagClient(triton_server.grpc_url) as client:
        try:
            built = indexer.build(corpus, client, MODEL_DIR, retrieval="hybrid", progress=False)
            version = str(built.version)
            client.load("retriever", version=built.version)
            hybrid = client.retrieve("E4711", top_k=3, version=version)
            dense = client.retrieve("E4711", top_k=3, version=version, mode="dense")
            assert hybrid[0].source == "codes.md" and hybrid[0].location == {"chunk": 0, "lines": [1, 2]}
            assert hybrid[0].score == pytest.approx(2 / 61, abs=1e-6)        # first in both: 1/(60 + 1), twice
            assert all(-1 <= p.score <= 1 for p in dense) and len(dense) == 3
            with pytest.raises(RagstackError, match=r"mode: 'sparse' is not one of \['dense', 'hybrid'\]") as info:
                client.retrieve("E4711", version=version, mode="sparse")
            assert info.value.code == "INVALID_ARG"
        finally:
            shutil.rmtree(MODEL_DIR / str(before[-1] + 1), ignore_errors=True)
            client.load("retriever")                          # back to the version that served before
            wait_until_settled(client, "retriever", timeout_s=60)
        assert index_store.versions(MODEL_DIR) == before
        default = client.retrieve("How is the KV cache divided into blocks?", top_k=2)   # version 1: dense
        assert default[0].location.get("lines") and -1 <= default[0].score <= 1
