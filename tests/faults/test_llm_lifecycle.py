"""The llm's lifecycle under load, on a server of its own: an unload or reload with streams open is
bounded by shutdown_timeout_s and leaves no engine behind, cycles of them leave the server alive and
its memory flat, and an engine that dies (SIGKILL) or hangs (SIGSTOP) is noticed, its requests end
with UNAVAILABLE at once (through `rag` as fast as directly), and a new engine serves with the
metrics still counting.

The llm is loaded with shutdown_timeout_s 3 and engine_stall_timeout_s 3 (a config override), so the
bounds are quick to test. RAGSTACK_SOAK_CYCLES raises the number of load/unload cycles (docs/operations.md
records a 50-cycle run).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from ragstack import load_gen, process_tree
from ragstack.launcher import DEFAULT_REPOSITORIES, TritonServer
from server_helpers import free_server_options, wait_until
from server_metrics import metric_value, wait_for_metric

pytestmark = pytest.mark.server
SHUTDOWN_S = 3
STALL_S = 3
STREAMS = 30
LONG = 1500  # tokens: every stream is still running when the fault comes
CYCLE_TOKENS = 400  # still running at the fault too, and a reload's old instance drains them in seconds
CYCLES = int(os.environ.get("RAGSTACK_SOAK_CYCLES", "3"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    options = free_server_options(model_repositories=list(DEFAULT_REPOSITORIES), models=["rag", "rerank", "llm"],
                                  exit_timeout_s=5)
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-lifecycle")) as s:
        admin = httpclient.InferenceServerClient(s.http_url)
        config = admin.get_model_config("llm")
        config["parameters"].update({"shutdown_timeout_s": {"string_value": str(SHUTDOWN_S)},
                                     "engine_stall_timeout_s": {"string_value": str(STALL_S)}})
        s.llm_config = json.dumps(config)
        admin.load_model("llm", config=s.llm_config)
        admin.close()
        wait_until(lambda: len(process_tree.engine_pids(s.process.pid, "llm_0_0")) == 1,
                   "the first instance's engine to exit", 30)
        yield s


@pytest.fixture
def admin(server):
    client = httpclient.InferenceServerClient(server.http_url)
    if not client.is_model_ready("llm"):
        client.load_model("llm", config=server.llm_config)
    yield client
    client.close()


def control(server) -> grpcclient.InferenceServerClient:
    """A repository client for the faults, which run in a thread (the HTTP client's gevent cannot)."""
    return grpcclient.InferenceServerClient(server.grpc_url)


def engine_pid(server) -> int:
    [pid] = process_tree.engine_pids(server.process.pid, "llm_0_0")
    return pid


async def streams_then(server, groups: dict[str, tuple[dict, int]], fault) -> tuple[list[float], list]:
    """Long streams, `count` of `tensors` per model in `groups`; once every one has streamed, `fault()`
    runs; returns how long after the fault each stream ended, and the streams' outcomes."""
    sent = time.monotonic()
    total = sum(count for _, count in groups.values())
    started: set[tuple[str, int]] = set()
    streaming = asyncio.Event()

    def on_response(model: str, i: int) -> None:
        started.add((model, i))
        if len(started) == total:
            streaming.set()

    runs = [asyncio.ensure_future(load_gen.run_many(server.grpc_url, model, [tensors] * count, 120,
                                                    on_response=lambda i, m=model: on_response(m, i)))
            for model, (tensors, count) in groups.items()]
    await asyncio.wait_for(streaming.wait(), 60)
    await asyncio.to_thread(fault)
    faulted = time.monotonic() - sent
    outcomes = [o for run in runs for o in (await run)[0]]
    return [o.seconds - faulted for o in outcomes], outcomes


def llm_once(server, max_tokens: int = 4) -> load_gen.Outcome:
    outcomes, _ = asyncio.run(load_gen.run_many(server.grpc_url, "llm", [load_gen.llm_tensors("hello", max_tokens)],
                                                30))
    return outcomes[0]


def test_an_unload_with_open_streams_ends_them_within_the_timeout_and_stops_the_engine(server, admin):
    engine = engine_pid(server)
    ends, outcomes = asyncio.run(streams_then(server, {"llm": (load_gen.llm_tensors("a long one", LONG), STREAMS)},
                                              lambda: control(server).unload_model("llm")))
    for outcome in outcomes:  # each ended with a FINAL: its text, or the unload's UNAVAILABLE
        assert outcome.status in (load_gen.OK, load_gen.ERROR), outcome
        assert outcome.status == load_gen.OK or "being unloaded" in outcome.error, outcome
    assert any(o.status == load_gen.ERROR for o in outcomes)  # the unload cut them short
    assert max(ends) < SHUTDOWN_S + 5, ends
    wait_until(lambda: not process_tree.is_alive(engine), "the engine process to exit after the unload", 10)
    admin.load_model("llm", config=server.llm_config)
    assert llm_once(server).status == load_gen.OK


def test_load_unload_and_reload_cycles_under_open_streams(server, admin):
    """Each cycle: STREAMS streams, then an unload (even cycles) or an unload + load at once (odd:
    a new instance starts while the old one drains). Every stream gets its FINAL, the server stays
    live, one engine and one stub remain, and the server's memory does not grow cycle over cycle."""
    rss = []
    for cycle in range(CYCLES):
        def fault():
            client = control(server)
            client.unload_model("llm")
            if cycle % 2:
                client.load_model("llm", config=server.llm_config)

        _, outcomes = asyncio.run(streams_then(server, {"llm": (load_gen.llm_tensors("a long one", CYCLE_TOKENS),
                                                                STREAMS)}, fault))
        assert all(o.status in (load_gen.OK, load_gen.ERROR) for o in outcomes), outcomes
        assert admin.is_server_live(), server.tail_log()
        if not admin.is_model_ready("llm"):
            admin.load_model("llm", config=server.llm_config)
        assert llm_once(server).status == load_gen.OK
        rss.append(process_tree.rss_bytes(server.process.pid))
    wait_until(lambda: len(process_tree.engine_pids(server.process.pid, "llm_0_0")) == 1, "one engine process", 15)
    wait_until(lambda: len(process_tree.stub_pids(server.process.pid, "llm_0_0")) == 1, "one llm stub", 15)
    print(f"tritonserver RSS per cycle, MB: {[round(r / 2**20) for r in rss]}")
    assert rss[-1] - rss[0] < 200 * 2**20, rss


def test_a_killed_engine_ends_llm_and_rag_streams_at_once_and_a_new_engine_serves(server, admin):
    finished_before = metric_value(server.metrics_url, "triton_llm_requests_finished_total")
    engine = engine_pid(server)
    groups = {"llm": (load_gen.llm_tensors("a long one", LONG), 3),
              "rag": (load_gen.rag_tensors("How does paged attention store the KV cache?", LONG), 2)}
    ends, outcomes = asyncio.run(streams_then(server, groups, lambda: os.kill(engine, signal.SIGKILL)))
    for outcome in outcomes:  # llm's and rag's: a FINAL with the error at once, no deadline waited for
        assert outcome.status == load_gen.ERROR and "was killed by SIGKILL" in outcome.error, outcome
        assert "a new engine is starting" in outcome.error, outcome
    assert max(ends) < 2, ends
    wait_until(lambda: llm_once(server).status == load_gen.OK, "a new engine to serve", 60)
    assert engine_pid(server) != engine
    # The metrics survive the restart and count on.
    assert metric_value(server.metrics_url, "triton_llm_requests_finished_total") > finished_before


def test_a_hung_engine_is_killed_after_the_stall_timeout_and_replaced(server, admin):
    engine = engine_pid(server)
    detected, outcomes = asyncio.run(streams_then(server, {"llm": (load_gen.llm_tensors("a long one", LONG), 2)},
                                                  lambda: os.kill(engine, signal.SIGSTOP)))
    for outcome in outcomes:
        assert outcome.status == load_gen.ERROR and "reported nothing for" in outcome.error, outcome
    assert max(detected) < STALL_S + 3, detected
    wait_until(lambda: not process_tree.is_alive(engine), "the stopped engine to be killed", 10)
    wait_until(lambda: llm_once(server).status == load_gen.OK, "a new engine to serve", 60)
    # the gauge is refreshed every metrics_interval_s: llm_once's own request may still be on it
    wait_for_metric(server.metrics_url, "triton_llm_num_requests_running", "llm", lambda value: value == 0, 5)
