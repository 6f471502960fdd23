"""Response instances on the real server: `llm_instances` (tests/fixtures/instances_repository) is the
demo LLM served by three instances, three stubs that each send their own requests' responses, in front
of one shared engine process. Concurrent streams spread over the instances each end with exactly one
FINAL and the text of the engine alone; the engine-wide metrics exist once, each instance's request
metrics once per instance; a cancel frees the KV blocks; an engine that dies is noticed by every
instance and one new engine serves them all; a reload starts an engine of its own and the old one
exits with its instances; an unload with streams open ends every stream and leaves no engine process
or stub. (tests/unit/test_response_instances.py: how many instances share an engine, and
`engine_process: false` refusing several.)"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc

from llm_engine import LLM
from llm_streams import StreamSession, llm_inputs
from ragstack import load_gen, process_tree
from ragstack.launcher import DEFAULT_REPOSITORIES, TritonServer
from raw_http import connect, request_bytes
from server_helpers import TINY_LLM, free_server_options, settled, wait_until

pytestmark = pytest.mark.server
INSTANCES_REPOSITORY = Path(__file__).resolve().parents[1] / "fixtures" / "instances_repository"
MODEL = "llm_instances"
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
LONG = 1500  # tokens: still running when the fault comes
SHUTDOWN_S = 3  # the fixture's shutdown_timeout_s
ENGINE_WIDE = ("triton_llm_kv_cache_blocks_used", "triton_llm_kv_cache_blocks_total", "triton_llm_num_requests_running",
               "triton_llm_num_requests_waiting", "triton_llm_preemptions_total", "vllm:num_requests_running",
               "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
               "vllm:generation_tokens_total")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    options = free_server_options(model_repositories=[*DEFAULT_REPOSITORIES, INSTANCES_REPOSITORY], models=[MODEL],
                                  exit_timeout_s=5)
    with TritonServer(options, work_dir=tmp_path_factory.mktemp("triton-instances")) as s:
        yield s


def stubs(server) -> list[int]:
    return [p for i in range(3) for p in process_tree.stub_pids(server.process.pid, f"{MODEL}_0_{i}")]


def engines(server) -> list[int]:
    return process_tree.model_engine_pids(server.process.pid, MODEL)


def series(server, name: str) -> dict[str, float]:
    """stub_pid -> value of `name`'s series for the model."""
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.split("{")[0] == name and f'model="{MODEL}"' in line:
            found[re.search(r'stub_pid="(\d+)"', line).group(1)] = float(line.rsplit(" ", 1)[1])
    return found


def generate_all(url: str, model: str, prompts: list[str], sampling=GREEDY) -> list:
    session = StreamSession(url)
    try:
        collected = [session.send(f"r{i}", llm_inputs(p, sampling=sampling), model=model) for i, p in enumerate(prompts)]
        session.wait_all(120)
    finally:
        session.close()
    return collected


def long_streams(server, count: int, fault) -> list[load_gen.Outcome]:
    """`count` long streams at once; once every one has streamed, `fault()` runs; their outcomes."""
    started: set[int] = set()

    async def main():
        streaming = asyncio.Event()

        def on_response(i: int) -> None:
            started.add(i)
            if len(started) == count:
                streaming.set()

        run = asyncio.ensure_future(load_gen.run_many(server.grpc_url, MODEL,
                                                      [load_gen.llm_tensors("a long one", LONG)] * count, 120,
                                                      on_response=on_response))
        await asyncio.wait_for(streaming.wait(), 60)
        await asyncio.to_thread(fault)
        return (await run)[0]

    return asyncio.run(main())


def test_concurrent_streams_over_the_instances_match_one_engine_alone(server):
    assert len(stubs(server)) == 3
    [engine] = engines(server)  # one engine, a child of one of the three stubs, its command line naming its model
    assert engine in [p for stub in stubs(server) for p in process_tree.descendants(stub)]
    assert process_tree.cmdline(engine)[-6:-4] == ["--model", f"{MODEL}/1"]
    prompts = [f"stream {i} of many says" for i in range(24)]
    shared = generate_all(server.grpc_url, MODEL, prompts)
    with LLM(str(TINY_LLM), device="cpu", max_model_len=2048) as llm:
        alone = llm.generate(prompts, [llm.engine.processor.process("p", p, GREEDY).sampling_params for p in prompts])
    for a, b in zip(shared, alone):
        assert not a.errors and a.finals == 1 and a.finish_reasons == ["length"], a
        assert a.text == b.text
    # A finish is counted a moment after its last response, by the stub's metrics thread.
    wait_until(lambda: sum(series(server, "triton_llm_requests_finished_total").values()) >= 24, "24 counted", 5)
    finished = series(server, "triton_llm_requests_finished_total")
    assert len([v for v in finished.values() if v > 0]) >= 2, finished  # Triton spread them


def test_engine_metrics_exist_once_and_request_metrics_once_per_instance(server):
    wait_until(lambda: all(len(series(server, name)) == 1 for name in ENGINE_WIDE), "one series each", 10)
    exporters = {stub for name in ENGINE_WIDE for stub in series(server, name)}
    assert len(exporters) == 1 and int(exporters.pop()) in stubs(server)
    assert series(server, "triton_llm_kv_cache_blocks_total").popitem()[1] > 0
    for name in ("triton_llm_requests_finished_total", "triton_llm_time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_count"):
        assert sorted(int(pid) for pid in series(server, name)) == sorted(stubs(server)), name


def test_a_cancel_frees_the_kv_blocks(server):
    outcomes, _ = asyncio.run(load_gen.run_many(server.grpc_url, MODEL, [load_gen.llm_tensors("cancel me", LONG)] * 6,
                                                60, cancel_after=[3] * 6))
    cancelled = time.monotonic()
    assert all(o.status == load_gen.CANCELLED for o in outcomes), outcomes
    wait_until(lambda: sum(series(server, "triton_llm_kv_cache_blocks_used").values()) == 0
               and sum(series(server, "triton_llm_num_requests_running").values()) == 0, "the KV blocks freed", 5)
    # Cancellation is checked at most every 20 ms per stream, the gauges refreshed every 0.2 s (the fixture's).
    assert time.monotonic() - cancelled < 1.5


def test_an_abort_by_key_reaches_the_instance_that_holds_the_request(server):
    """The gateway aborts a generation whose client went away by its cancel key, as rag_generate aborts
    the llm request of a cancelled rag query: that abort request lands on any instance, and every
    instance's requests must stop. Six answered-once requests spread over three instances."""
    body = json.dumps({"text_input": "a long one", "stream": False,
                       "parameters": {"max_tokens": LONG, "ignore_eos": True}}).encode()
    socks = [connect(server.http_url) for _ in range(6)]
    for sock in socks:
        sock.sendall(request_bytes("POST", f"/v2/models/{MODEL}/generate", body, {"Content-Type": "application/json"}))
    wait_until(lambda: sum(series(server, "triton_llm_num_requests_running").values()) == 6, "six running", 60)
    for sock in socks:
        sock.close()
    gone = time.monotonic()
    wait_until(lambda: sum(series(server, "triton_llm_kv_cache_blocks_used").values()) == 0
               and sum(series(server, "triton_llm_num_requests_running").values()) == 0, "the KV blocks freed", 10)
    assert time.monotonic() - gone < 1.0   # 0.21 s measured; uncancelled, these run about 4 s here


def test_an_abort_that_comes_before_its_request_ends_the_request_as_it_arrives(server):
    """A rag query whose client leaves during retrieval is aborted by its key before its llm request exists
    (review 15: 1 to 5 of 30 such generations ran to max_tokens for nobody). Six keys aborted, each on the
    instance Triton picks, then six long requests carrying them, spread over the three instances: each
    ends at once, CANCELLED, and the engine sees no prompt of theirs."""
    keys = [uuid.uuid4().hex for _ in range(6)]

    async def send_all(parameters: list[dict], tensors: dict) -> list[load_gen.Outcome]:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            requests = []
            for i, params in enumerate(parameters):
                request = load_gen.request_proto(MODEL, tensors, f"early-{i}")
                for name, value in params.items():
                    request.parameters[name].string_param = value
                requests.append(request)
            return await asyncio.gather(*(load_gen.run_one(stub, r, 60) for r in requests))

    aborts = asyncio.run(send_all([{"ragstack_abort": key} for key in keys], {}))
    assert all(o.status == load_gen.OK for o in aborts), aborts
    prompts = settled(lambda: sum(series(server, "vllm:prompt_tokens_total").values()))
    started = time.monotonic()
    outcomes = asyncio.run(send_all([{"ragstack_cancel_key": key} for key in keys],
                                    load_gen.llm_tensors("aborted already", LONG)))
    assert time.monotonic() - started < 1.0   # uncancelled, they run about 4 s here
    for outcome in outcomes:
        assert outcome.status == load_gen.ERROR and "aborted by its key before it arrived" in outcome.error, outcome
    assert settled(lambda: sum(series(server, "vllm:prompt_tokens_total").values())) == prompts


def test_a_killed_engine_is_noticed_by_every_instance_and_one_new_engine_serves_them(server):
    [engine] = engines(server)
    outcomes = long_streams(server, 9, lambda: os.kill(engine, signal.SIGKILL))
    for outcome in outcomes:  # each instance's streams end at once, naming the engine
        assert outcome.status == load_gen.ERROR and f"the engine process (pid {engine})" in outcome.error, outcome
        assert "a new engine is starting" in outcome.error, outcome
    wait_until(lambda: len(engines(server)) == 1 and engines(server) != [engine], "one new engine", 60)

    def all_serve() -> bool:
        before = series(server, "triton_llm_requests_finished_total")
        served, _ = asyncio.run(load_gen.run_many(server.grpc_url, MODEL, [load_gen.llm_tensors("again", 4)] * 9, 30))
        after = series(server, "triton_llm_requests_finished_total")
        return all(o.status == load_gen.OK for o in served) and all(after[p] > before.get(p, 0) for p in after)

    wait_until(all_serve, "every instance to serve again", 60)
    assert len(engines(server)) == 1


def test_a_reload_and_an_unload_leave_no_engine_or_stub_behind(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    [engine], old_stubs = engines(server), stubs(server)
    # A reload (the same config) starts new instances while the old ones drain: the old engine took its
    # three clients, so the new ones start an engine of their own, and the old one exits after its own.
    client.load_model(MODEL, config=json.dumps(client.get_model_config(MODEL, as_json=True)["config"]))
    wait_until(lambda: len(engines(server)) == 1 and engine not in engines(server), "the reload's own engine", 30)
    wait_until(lambda: len(stubs(server)) == 3 and not set(stubs(server)) & set(old_stubs), "the old stubs gone", 30)
    [engine] = engines(server)
    outcomes = long_streams(server, 9, lambda: client.unload_model(MODEL))
    for outcome in outcomes:  # each ended with a FINAL: its text, or the unload's UNAVAILABLE
        assert outcome.status == load_gen.OK or "being unloaded" in outcome.error, outcome
    wait_until(lambda: not process_tree.is_alive(engine), "the engine to exit", SHUTDOWN_S + 10)
    wait_until(lambda: not stubs(server), "the stubs to exit", 30)
    client.close()
