"""A cancellation storm on the session server's llm: 500 streams at once, half of them cancelled by
the client at random points (before the first token, mid-stream, near the end). Afterwards no KV
block is held, nothing runs or waits, and the counters agree with what finished."""
from __future__ import annotations

import asyncio
import random

import pytest

from ragstack import load_gen
from server_helpers import settled
from server_metrics import metric_value, wait_for_metric

pytestmark = pytest.mark.server
STREAMS, TOKENS = 500, 32
COUNTERS = ["triton_llm_requests_finished_total", "triton_llm_generation_tokens_total",
            "triton_llm_e2e_request_latency_seconds_count"]


def test_half_of_500_streams_cancelled_leak_nothing(triton_server):
    rng = random.Random(8)
    # Counted in responses (0: right after sending); a stream that falls behind gets several tokens merged
    # into one response, so a stream has fewer responses than tokens: cancel within the first few.
    cancel_after = [rng.randrange(TOKENS // 8) if i % 2 else None for i in range(STREAMS)]
    before = {name: metric_value(triton_server.metrics_url, name) for name in COUNTERS}
    outcomes, _ = asyncio.run(load_gen.run_many(
        triton_server.grpc_url, "llm", [load_gen.llm_tensors(f"storm {i}", TOKENS) for i in range(STREAMS)],
        timeout_s=120, cancel_after=cancel_after))

    kept = [o for o, c in zip(outcomes, cancel_after) if c is None]
    cancelled = [o for o, c in zip(outcomes, cancel_after) if c is not None]
    assert all(o.status == load_gen.OK for o in kept), load_gen.summarize(kept, 1)
    # a cancel that arrives after the last response finds nothing to cancel: the stream ends ok
    assert all(o.status in (load_gen.CANCELLED, load_gen.OK) for o in cancelled), load_gen.summarize(cancelled, 1)
    assert sum(o.status == load_gen.CANCELLED for o in cancelled) > STREAMS // 8

    for gauge in ("triton_llm_kv_cache_blocks_used", "triton_llm_num_requests_running",
                  "triton_llm_num_requests_waiting"):
        wait_for_metric(triton_server.metrics_url, gauge, "llm", lambda v: v == 0)
    # a cancelled stream the engine finished first is counted when the backend handles its last output,
    # which can come after the gauges read idle
    delta = settled(lambda: {name: metric_value(triton_server.metrics_url, name) - before[name] for name in COUNTERS})
    finished = delta["triton_llm_requests_finished_total"]
    # every uncancelled request finished; a cancelled one only if the engine got there first
    assert len(kept) + sum(o.status == load_gen.OK for o in cancelled) <= finished <= STREAMS, delta
    assert delta["triton_llm_generation_tokens_total"] == finished * TOKENS, delta
    assert delta["triton_llm_e2e_request_latency_seconds_count"] == finished, delta
