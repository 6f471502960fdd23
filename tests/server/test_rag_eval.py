"""`ragstack eval` against the session server's sample-corpus index: the figures of each stage from labeled
queries (the retriever tests' known questions), every context in the reranked order, every rag query at its
defaults answered; and the exit code and table of the CLI."""
from __future__ import annotations

import json

import pytest

from ragstack.cli import main
from ragstack.client import RagClient
from ragstack.eval_sets import read_queries
from ragstack.evaluate import evaluate

pytestmark = pytest.mark.server
LABELED = [
    ("How is the KV cache divided into blocks?", "paged_attention.md"),
    ("Which FAISS index performs exact cosine search?", "faiss.html"),
    ("What happens when a new model version is loaded?", "model_repository.md"),
    ("How are documents split into chunks with overlap?", "chunking.md"),
    ("How much memory does an FP8 KV cache save?", "kv_cache_fp8.html"),
]


@pytest.fixture()
def queries_file(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_text("".join(json.dumps({"id": f"k{i}", "query": q, "relevant": [doc]}) + "\n"
                            for i, (q, doc) in enumerate(LABELED)))
    return path


def test_eval_over_the_served_pipeline(triton_server, queries_file):
    with RagClient(triton_server.grpc_url) as client:
        result = evaluate(client, read_queries(queries_file), top_k=10, answers=True)
    assert set(result.stages) == {"retrieval (dense)", "retrieval (hybrid)", "retrieval", "rerank", "context"}
    assert result.stages["retrieval"] == result.stages["retrieval (dense)"]     # the sample index is dense
    assert result.stages["rerank"] == result.stages["retrieval"]                 # pair-cosine: the retriever's order
    assert result.stages["retrieval (dense)"]["MRR@10"] >= 0.8 and result.stages["context"]["recall@10"] >= 0.8
    assert result.context_in_reranked_order == result.queries == len(LABELED)
    assert result.answers_ok == len(LABELED) and not result.answer_errors
    assert 1 <= result.context_passages <= 4


def test_the_eval_command(triton_server, queries_file, capsys, tmp_path):
    code = main(["eval", str(queries_file), "--url", triton_server.grpc_url, "--modes", "dense",
                 "--json", str(tmp_path / "out.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "| stage | MRR@10 | recall@1 | recall@5 | recall@10 | nDCG@10 |" in out
    assert f"in the reranked order for {len(LABELED)} of {len(LABELED)}" in out
    assert json.loads((tmp_path / "out.json").read_text())["queries"] == len(LABELED)
    assert main(["eval", "--url", triton_server.grpc_url]) == 2 and "give a query file or --set" in capsys.readouterr().err
