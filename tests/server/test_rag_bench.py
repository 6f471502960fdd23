"""The RAG benchmark against the session's server: a short run with sane numbers and a per-step breakdown."""
from __future__ import annotations

from ragstack import rag_bench


def test_bench_rows_are_sane(triton_server):
    rows = rag_bench.bench(triton_server.grpc_url, "grpc", (2,), requests=4, max_tokens=8,
                           metrics_url=triton_server.metrics_url)
    assert len(rows) == 1
    row = rows[0]
    assert row["ok"] == 4, row["errors"]
    assert row["qps"] > 0
    assert 0 < row["ttft_p50_ms"] <= row["e2e_p99_ms"]
    assert 0 < row["e2e_p50_ms"] <= row["e2e_p99_ms"]
    for model in ("embedder", "retriever", "rag_rerank", "llm"):
        assert row["steps"][model]["calls"] >= 4
        assert row["steps"][model]["request_ms"] > 0
    assert all(row["steps"]["llm"][key] > 0 for key in ("ttft_ms", "first_response_ms", "e2e_ms"))
    assert "| requests ok | 4/4 |" in rag_bench.table(rows)
