"""Load on the session server, bounded for CI (benchmarks/load_test.py runs the full-size version):
1000 concurrent streaming llm requests with 200 concurrent rag queries, every one followed to its
end, the server's memory compared before and after; then an overload burst beyond llm_small_queue's
queue (max_num_seqs=2, max_waiting=2)."""
from __future__ import annotations

import asyncio
import time

import pytest

from ragstack import load_gen, process_tree
from server_metrics import pending_requests, wait_for_metric

pytestmark = pytest.mark.server
MiB = 1 << 20


def wait_idle(server, model: str = "llm") -> None:
    for gauge in ("triton_llm_num_requests_running", "triton_llm_num_requests_waiting",
                  "triton_llm_kv_cache_blocks_used"):
        wait_for_metric(server.metrics_url, gauge, model, lambda v: v == 0)


def test_1000_streams_and_200_rag_queries_all_end_and_memory_levels_off(triton_server):
    pid = triton_server.process.pid
    # A smaller round first: what the first requests allocate for good belongs to the baseline.
    asyncio.run(load_gen.mixed(triton_server.grpc_url, 100, 32, 8, 4, rag_top_k=2))
    wait_idle(triton_server)
    before = process_tree.tree_rss_bytes(pid)
    with process_tree.PeakSampler(pid) as peak:
        result = asyncio.run(load_gen.mixed(triton_server.grpc_url, 1000, 200, 8, 4, rag_top_k=2))
    for kind, summary in result.items():
        # both fit: the llm queues 1024 and runs 256, rag_generate admits 256
        assert summary["ok"] == summary["requests"], (kind, summary, "pending",
                                                      pending_requests(triton_server.metrics_url))
    wait_idle(triton_server)
    time.sleep(2)
    after = process_tree.tree_rss_bytes(pid)
    print(f"\nload: {result}\nserver tree RSS before {before / MiB:.0f} MiB, peak {peak.bytes / MiB:.0f}, "
          f"after {after / MiB:.0f}")
    assert after - before < max(0.1 * before, 150 * MiB), (before / MiB, peak.bytes / MiB, after / MiB)


def test_overload_is_refused_at_once_and_admitted_latency_stays_bounded(triton_server):
    result = asyncio.run(load_gen.overload(triton_server.grpc_url, "llm_small_queue", burst=200, max_tokens=20))
    alone_s = result["alone"].seconds
    assert result["alone"].status == load_gen.OK and result["other"] == 0, result
    assert result["admitted"] >= 2 and result["refused"] >= 150, result
    assert list(result["errors"]) == ["waiting queue is full (max_waiting=2); retry later"]
    # Refused without queueing; the admitted wait for at most the 2 running and 2 waiting ahead of them.
    assert result["refused_max_ms"] < 2000, result
    assert result["admitted_p99_ms"] / 1e3 < 6 * alone_s + 1.0, result
    assert result["after"].status == load_gen.OK and result["after"].seconds < 5 * alone_s + 1.0, result
    wait_idle(triton_server, "llm_small_queue")
