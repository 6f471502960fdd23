"""The KV cache exhausted by long prompts (llm_small_kv: 384 cached tokens, 12 requests of 138
prompt and 64 output tokens at once): sequences are preempted and recomputed, every request still
completes, with the same greedy text as when it runs alone, and no block stays in use."""
from __future__ import annotations

import time

import pytest

from llm_streams import StreamSession, llm_inputs
from server_metrics import metric_value, wait_for_metric

pytestmark = pytest.mark.server
MODEL, REQUESTS, TOKENS, BURSTS = "llm_small_kv", 12, 64, 3
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": TOKENS}


def prompt(i: int) -> str:
    # 138 tokens (18 blocks of 8): two fit in the pool, but not once they have grown to 202 tokens (26 blocks
    # each), so two that start together preempt.
    return f"request {i}: " + "word " * 44


def alone(url: str, i: int) -> str:
    session = StreamSession(url)
    try:
        collected = session.send("alone", llm_inputs(prompt(i), sampling=GREEDY), model=MODEL)
        session.wait_all(60)
    finally:
        session.close()
    assert not collected.errors and collected.finals == 1
    return collected.text


def burst(url: str) -> list:
    session = StreamSession(url)
    try:
        collected = [session.send(f"kv{i}", llm_inputs(prompt(i), sampling=GREEDY), model=MODEL)
                     for i in range(REQUESTS)]
        session.wait_all(240)
    finally:
        session.close()
    return collected


def test_long_prompts_beyond_the_pool_are_preempted_and_all_complete(triton_server):
    """Two prompts that start together always meet in the pool; one that starts as the other ends may not, when
    the requests reach the engine spread out (a busy 2-core machine): then the burst is sent again, at most
    BURSTS times, until one preempted."""
    url, metrics = triton_server.grpc_url, triton_server.metrics_url
    expected = {i: alone(url, i) for i in (0, REQUESTS - 1)}
    preempted = metric_value(metrics, "triton_llm_preemptions_total", MODEL)
    for attempt in range(BURSTS):
        collected = burst(url)
        for c in collected:
            assert not c.errors and c.finals == 1 and c.finish_reasons == ["length"], c
        for i, text in expected.items():
            assert collected[i].text == text  # recomputed after preemption: the same tokens
        wait_for_metric(metrics, "triton_llm_kv_cache_blocks_used", MODEL, lambda v: v == 0)
        time.sleep(1.0)   # the engine's counters reach the metrics at least once a second
        if metric_value(metrics, "triton_llm_preemptions_total", MODEL) > preempted:
            return
    raise AssertionError(f"no preemption in {BURSTS} bursts of {REQUESTS} requests")
