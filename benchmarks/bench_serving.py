"""Serving benchmark: the same requests through the real Triton server (gRPC streaming, the llm
model), through the engine in-process (AsyncLLMEngine) and, with --baseline hf, through the same
server running HF generate() in a plain Python model (benchmarks/serving_baselines/hf_generate), side
by side in one run. With --api openai: through the OpenAI frontend (streamed completions; --openai-workers
N frontend processes) and to Triton's gRPC directly, on the same server, at each concurrency, in --rounds
rounds taking turns (a drift of the server over a level falls on both alike). The
frontend's events are read by a lean client (sse_client.py), as vLLM's serving benchmark reads them: the
official openai SDK spends ~1 ms of CPU on a request and ~0.1 ms on a chunk (bench_openai_frontend.py
--what client), which would be timed as the frontend's. Every served system's streams are shared out among
--client-processes client processes (4), since one client process is itself a limit (the in-process run has
no client): one event loop parsing thousands of responses a second delays them, in bursts, and delays the
next requests' first tokens (issue 24's 64 and 256 streams are 9-20k a second).
With --instances 1,4,8: the llm served with each count of instances (stubs sending responses, in front
of one engine process: docs/llm_model.md, "Response instances"), one server after the other, each
system named `triton xK` (`triton` for one), all against the same in-process run, and each checked
against issue 24's targets (tok/s >= 98% of in-process; TTFT and ITL p50/p99 within 1.15x or +2 ms).

The script writes a temporary model repository whose `llm` runs --model with the given engine
settings, starts the server with the launcher, sends N requests at each concurrency, stops it;
with --baseline hf it does the same for a repository holding only the baseline (the GPU is the
baseline's alone); then it replays the same requests in-process. No engine sees a prompt twice: each
level has prompts of its own, the warm-ups others, and the frontend's differ from gRPC's on their shared
server (same lengths), since the prefix cache would serve a repeat (serving_requests.py). Each system
runs a closed loop per stream: the next request as soon as the last one ended, its TTFT timed from then,
so the wait for its client's event loop (in-process: for the tokenizing of the requests ahead) counts.
Rows: output tok/s, TTFT and inter-token p50/p99 (the baseline answers once per request: its TTFT is the
whole request), the engine's share of its TTFT, and the prompt tokens it prefilled (100% unless its cache
served some, or preempted sequences were recomputed) with its preemptions.

    python -m benchmarks.bench_serving --model /tmp/llama3-8b --num-requests 200 --concurrency 1,16,64 --baseline hf
    python -m benchmarks.bench_serving --model /tmp/llama3-8b --num-requests 32,96,192,384 --concurrency 1,16,64,256 \
        --api openai --openai-workers 4 --rounds 8,2,1,1
    python -m benchmarks.bench_serving --model /tmp/llama3-8b --concurrency 1,16,64,256 --instances 1,4,8
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import string
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.serving_requests import RequestSets
from benchmarks.sse_client import SSEConnection
from benchmarks.table import markdown, rounded

ROOT = Path(__file__).resolve().parents[1]
HF_BASELINE = Path(__file__).resolve().parent / "serving_baselines" / "hf_generate"
HF_SYSTEM = "hf-generate (triton)"
OPENAI_SYSTEM = "openai frontend"
WORKER_REQUESTS = "ragstack_openai_worker_requests"   # ragstack.openai_frontend.metrics
TARGET_SPEEDUP = 2.6  # issue 7: the published vLLM-over-Triton-PyTorch throughput gap
# Issue 24: through Triton against in-process, same run.
TARGET_TOK_S_SHARE = 0.98
TARGET_LATENCY_RATIO, TARGET_LATENCY_SLACK_MS = 1.15, 2.0
# Issue 22: through the OpenAI frontend against gRPC directly, same server.
TARGET_OPENAI_TOK_S_SHARE, TARGET_OPENAI_TTFT_SLACK_MS = 0.95, 5.0


# The llm's engine counters per level: prefill tokens computed (cache hits not), prompt tokens of finished
# requests, preemptions. The engine-wide ones are refreshed every metrics_interval_s (0.25 s), and a request's
# latencies observed by a thread of the stub's a moment after it has them.
ENGINE_COUNTERS = ("vllm:prompt_tokens_total", "triton_llm_prompt_tokens_total", "triton_llm_preemptions_total")
METRICS_REFRESH_S = 0.6


@dataclass
class Result:
    ttft: float
    gaps: list[float]
    tokens: int
    prompt_tokens: int = 0  # in-process only (the served engine's count is in its metrics)
    ramp: bool = False      # its slot's first: sent with the others at the run's start (closed_loop)


def percentile_ms(values, q):
    return float(np.percentile(values, q) * 1e3) if values else float("nan")


async def closed_loop(requests, concurrency: int, send, started: list | None = None) -> tuple[list[Result], float]:
    """`concurrency` slots, each sending its next request the moment its last one has ended, as a client that
    sends at once: `await send(i, request, start)` sends request i and returns its Result, timed from `start`,
    when its slot became free (the run's start for the first ones). So what a request waits for before it is
    sent (this event loop busy with the others, the in-process engine tokenizing the requests ahead of it)
    counts, as a server's queue counts. `started`: given, the start's time.perf_counter() is appended to it
    (spread's clock). Returns the results in the requests' order, and the seconds from start to the last end.
    Each slot's first request is marked `ramp`: those start together and queue behind each other's prefills."""
    jobs = iter(enumerate(requests))
    results: list[Result | None] = [None] * len(requests)
    t0 = time.perf_counter()
    if started is not None:
        started.append(t0)

    async def slot() -> None:
        free = t0
        for i, request in jobs:
            results[i] = await send(i, request, free)
            results[i].ramp = free == t0
            free = time.perf_counter()

    await asyncio.gather(*(slot() for _ in range(min(concurrency, len(requests)))))
    return results, time.perf_counter() - t0


async def run_triton(url: str, requests, concurrency: int, model: str = "llm",
                     batched: bool = False, started: list | None = None) -> tuple[list[Result], float]:
    """`batched`: the model has max_batch_size > 0, so every tensor carries a batch dimension of 1.
    `started`: as closed_loop's."""
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    shape = [1, 1] if batched else [1]

    def inputs(prompt: str, max_tokens: int):
        tensors = []
        for name, value, dtype in (
                ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
                ("stream", np.array([True]), "BOOL"),
                ("sampling_parameters", np.array([json.dumps({"temperature": 0.0, "max_tokens": max_tokens,
                                                              "ignore_eos": True}).encode()], dtype=np.object_),
                 "BYTES"),
                ("return_num_output_tokens", np.array([True]), "BOOL")):
            t = grpcclient.InferInput(name, shape, dtype)
            t.set_data_from_numpy(value.reshape(shape))
            tensors.append(t)
        return tensors

    async def send(i: int, request: tuple[str, int], start: float) -> Result:
        prompt, max_tokens = request

        async def gen():
            yield {"model_name": model, "inputs": inputs(prompt, max_tokens), "request_id": str(i)}
        times, tokens = [], 0
        async for result, error in client.stream_infer(gen()):
            if error is not None:
                raise RuntimeError(f"request {i}: {error}")
            times.append(time.perf_counter())
            tokens += int(result.as_numpy("num_output_tokens").reshape(-1)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        return Result(times[0] - start, list(np.diff(times)), tokens)

    try:
        await client.is_server_live()   # the channel is connected before any request is timed
        return await closed_loop(requests, concurrency, send, started)
    finally:
        await client.close()


async def run_openai(base_url: str, requests, concurrency: int, model: str = "llm",
                     started: list | None = None) -> tuple[list[Result], float]:
    """The requests run_triton sends, as streamed completions through the OpenAI frontend: the same prompt
    and sampling (the frontend adds the token counts it reports to the llm's inputs), read by the lean SSE
    client (sse_client.py; the openai SDK's own CPU per request would be timed too), on kept-alive
    connections, one per slot of closed_loop, opened before any request is timed (as gRPC's channel is)."""
    address = urllib.parse.urlsplit(base_url)
    connections = [SSEConnection(address.hostname, address.port) for _ in range(min(concurrency, len(requests)))]

    async def send(i: int, request: tuple[str, int], start: float) -> Result:
        prompt, max_tokens = request
        connection = connections.pop() if connections else SSEConnection(address.hostname, address.port)
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                           "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()
        times, tokens = [], 0
        async for data in connection.events("/v1/completions", body):
            if data == b"[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"request {i}: {chunk['error']}")
            if chunk.get("choices"):   # a chunk per llm response, as run_triton counts them
                times.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        connections.append(connection)
        return Result(times[0] - start, list(np.diff(times)), tokens)

    try:
        await asyncio.gather(*(connection.connect() for connection in connections))
        return await closed_loop(requests, concurrency, send, started)
    finally:
        for connection in connections:
            await connection.close()


def _client_process(api: str, url: str, requests, concurrency: int, model: str, batched: bool):
    """One client process's share (spread): its results, its start and its end on time.perf_counter(),
    which on Linux is CLOCK_MONOTONIC, one clock for every process."""
    started: list[float] = []
    if api == "openai":
        results, elapsed = asyncio.run(run_openai(url, requests, concurrency, model, started=started))
    else:
        results, elapsed = asyncio.run(run_triton(url, requests, concurrency, model, batched, started=started))
    return results, started[0], started[0] + elapsed


def _warm_client_process(_: int) -> None:
    import tritonclient.grpc.aio  # noqa: F401  (imported once per process, before any run is timed)
    time.sleep(0.5)   # so that each of the pool's processes takes one


def spread(pool, processes: int, api: str, url: str, requests, concurrency: int, model: str,
           batched: bool = False) -> tuple[list[Result], float]:
    """run_openai or run_triton (`api`) over `processes` client processes (at most one per stream), so that
    what is measured is the server, not one client's event loop: process k sends requests k, k + P, ...
    with its share of the concurrency. Elapsed: from the first process's start to the last one's end."""
    p = max(1, min(processes, concurrency, len(requests)))
    shares = [concurrency // p + (1 if k < concurrency % p else 0) for k in range(p)]
    futures = [pool.submit(_client_process, api, url, requests[k::p], shares[k], model, batched) for k in range(p)]
    parts = [f.result() for f in futures]
    results = [None] * len(requests)
    for k, (part, _, _) in enumerate(parts):
        results[k::p] = part
    return results, max(end for _, _, end in parts) - min(start for _, start, _ in parts)


async def run_in_process(engine, requests, concurrency: int) -> tuple[list[Result], float]:
    """The requests through the engine in this process's event loop, which tokenizes each one as it is
    added (closed_loop: the time a request waits for the others' tokenizing counts)."""
    async def send(i: int, request: tuple[str, int], start: float) -> Result:
        prompt, max_tokens = request
        times, tokens = [], 0
        params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
        async for out in engine.add_request(f"r{i}-{concurrency}", prompt, params):
            if out.delta_text or out.finished:  # the server sends a response exactly then
                times.append(time.perf_counter())
            tokens = len(out.token_ids)
        return Result(times[0] - start, list(np.diff(times)), tokens, len(out.prompt_token_ids))

    return await closed_loop(requests, concurrency, send)


def summarize(system: str, concurrency: int, results: list[Result], elapsed: float,
              server: dict | None = None, engine: tuple[float, float, float] | None = None) -> dict:
    """`server`: the llm's per-call means from the server's metrics over the run (rag_bench.breakdown), so
    that a served TTFT can be split into Triton's queue, the engine's own TTFT (from the stub's intake to the
    first token), the time to the first response (the same, plus the stub's relay to Triton) and the rest
    (gRPC in, execute, the response's way out through Triton and gRPC, the client). `engine`: the
    engine's (prefill tokens computed, prompt tokens, preemptions) over the run: a prefix-cache hit or a
    recomputed prompt would show in their ratio."""
    tokens = sum(r.tokens for r in results)
    ttft = [r.ttft for r in results]
    # The ramp's requests (a third of a level of 3 x its streams) wait for each other's prefills, the same on
    # every system, and whether the p50 falls among them or after them moves it by tens of ms from round to
    # round: the requests after it are the steadier comparison of two ways in. (Where a round holds few requests
    # beyond its streams, those after the ramp run as the loop winds down, at less than the level's load.)
    settled = [r.ttft for r in results if not r.ramp]
    gaps = [g for r in results for g in r.gaps]
    server = server or {}
    prefilled, prompt, preemptions = engine or (None, None, None)
    return {"system": system, "concurrency": concurrency, "requests": len(results), "output_tokens": tokens,
            "seconds": elapsed, "tok_s": tokens / elapsed, "ttft_p50_ms": percentile_ms(ttft, 50),
            "ttft_p99_ms": percentile_ms(ttft, 99), "ttft_after_ramp_p50_ms": percentile_ms(settled, 50),
            "itl_p50_ms": percentile_ms(gaps, 50),
            "itl_p99_ms": percentile_ms(gaps, 99), "ttft_mean_ms": float(np.mean(ttft) * 1e3) if ttft else float("nan"),
            "server_queue_ms": server.get("queue_ms"), "engine_ttft_ms": server.get("ttft_ms"),
            "first_response_ms": server.get("first_response_ms"), "prefilled_share": prefilled / prompt if prompt else None, "preemptions": preemptions}


def table_row(r: dict) -> dict:
    return {"system": r["system"], "concurrency": r["concurrency"], "requests": r["requests"],
            "output tok": r["output_tokens"], "tok/s": round(r["tok_s"]),
            **{f"{name} {q} ms": rounded(r[f"{key}_{q}_ms"], 1) for name, key in (("TTFT", "ttft"), ("ITL", "itl"))
               for q in ("p50", "p99")},
            "TTFT mean ms": rounded(r.get("ttft_mean_ms"), 1),
            "TTFT p50 after the ramp ms": rounded(r.get("ttft_after_ramp_p50_ms"), 1),
            "of it: Triton queue / engine TTFT / first response sent ms (server means)": (
                f"{r['server_queue_ms']:.1f} / {r['engine_ttft_ms']:.1f} / {r['first_response_ms']:.1f}"
                if None not in (r.get("server_queue_ms"), r.get("engine_ttft_ms"), r.get("first_response_ms"))
                else None),
            "prefilled % of prompt tokens / preemptions": (
                f"{100 * r['prefilled_share']:.0f} / {r['preemptions']:.0f}"
                if r.get("prefilled_share") is not None else None)}


def triton_system(instances: int) -> str:
    return "triton" if instances == 1 else f"triton x{instances}"


def write_repository(dest: Path, model: str, settings: dict, instances: int = 1) -> None:
    """The project's llm config with `instances` instances, its engine settings replaced by this run's
    (engine.json wins)."""
    llm = dest / "llm"
    (llm / "1").mkdir(parents=True)
    config = (ROOT / "model_repository" / "llm" / "config.pbtxt").read_text()
    group = "instance_group [ { kind: KIND_MODEL, count: 1 } ]"
    if group not in config:
        raise SystemExit(f"model_repository/llm/config.pbtxt has no line {group!r} to set the instances in")
    counted = f"instance_group [ {{ kind: KIND_MODEL, count: {instances} }} ]"
    (llm / "config.pbtxt").write_text(config.replace(group, counted))
    (llm / "1" / "engine.json").write_text(json.dumps({"model": str(Path(model).resolve()), **settings}))


def write_hf_baseline(dest: Path, model: str, max_batch_size: int) -> None:
    """The HF generate() baseline as the model `hf_generate`: its config filled in, model.py in 1/."""
    folder = dest / "hf_generate"
    (folder / "1").mkdir(parents=True)
    template = string.Template((HF_BASELINE / "config.pbtxt.template").read_text())
    (folder / "config.pbtxt").write_text(template.substitute(model=Path(model).resolve(),
                                                             max_batch_size=max_batch_size))
    shutil.copy(HF_BASELINE / "model.py", folder / "1" / "model.py")


def in_turns(systems: list[tuple[str, str, list]], rounds: int, run, snapshot) -> dict[str, tuple[list, float, dict]]:
    """Each system (name, api, requests) runs its requests in `rounds` rounds, every k-th request in round k,
    the systems taking turns: in the given order in even rounds, reversed in odd ones. `run(api, requests)`
    returns (results, seconds); `snapshot()` the server's counters, read before the first run and after
    each. Returns per name: its results, the seconds of its own runs, and the counters' growth over them."""
    pooled = {name: ([], 0.0, {}) for name, _, _ in systems}
    last = snapshot()
    for k in range(rounds):
        for name, api, requests in systems if k % 2 == 0 else systems[::-1]:
            results, elapsed = run(api, requests[k::rounds])
            now = snapshot()
            done, seconds, counters = pooled[name]
            for key in now.keys() | last.keys():
                counters[key] = counters.get(key, 0.0) + now.get(key, 0.0) - last.get(key, 0.0)
            pooled[name] = (done + results, seconds + elapsed, counters)
            last = now
    return pooled


def serve(write, model: str, system: str, levels: list[int], level_requests: list[list],
          batched: bool = False, openai: tuple[list, list[list]] | None = None, openai_system: str = OPENAI_SYSTEM,
          openai_workers: int = 1, client_processes: int = 1, rounds: list[int] | None = None) -> list[dict]:
    """A server on a fresh repository that `write(dest)` fills with `model`: at each concurrency its
    level's requests, then stop. `openai` (the warm-up's requests and each level's): the server's OpenAI
    frontend too (with `openai_workers` processes), on requests of its own (serving_requests.py). `rounds`
    (one per level, default 1): each system's requests of a level are sent in this many rounds, every k-th
    request in round k, the systems taking turns (gRPC first in even rounds, the frontend first in odd ones),
    so that a drift of the server over a level (its clocks, its caches, other work on the host) falls on
    both alike; a system's row pools its rounds (tok/s: its tokens over the seconds of its own rounds).
    Every system's requests are sent from `client_processes` processes (spread), so that one client's event
    loop is not what is measured."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ragstack import rag_bench
    from ragstack.launcher import ServerOptions, TritonServer, free_port
    from ragstack.openai_frontend.limits import FrontendLimits

    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        write(Path(tmp))
        options = ServerOptions(model_repositories=[Path(tmp)], models=[model], http_port=free_port(),
                                grpc_port=free_port(), metrics_port=free_port(), startup_timeout_s=900,
                                openai_port=free_port() if openai is not None else 0,
                                openai=FrontendLimits(workers=openai_workers))
        pool = None
        if openai is not None or client_processes > 1:
            pool = stack.enter_context(ProcessPoolExecutor(client_processes,
                                                           mp_context=multiprocessing.get_context("spawn")))
            list(pool.map(_warm_client_process, range(client_processes)))
        load_start = time.perf_counter()
        with TritonServer(options) as server:
            print(f"{system}: server ready in {time.perf_counter() - load_start:.1f} s", flush=True)
            if openai is not None:  # its first requests read the model's config and open each worker's channel
                spread(pool, client_processes, "openai", server.openai_url, openai[0], len(openai[0]), model)

            def scrape() -> dict:
                time.sleep(METRICS_REFRESH_S)  # the engine's counters and the observed latencies have caught up
                counters = rag_bench.scrape(server.metrics_url, (*rag_bench.COUNTERS, *ENGINE_COUNTERS))
                return {**counters, **(worker_requests(server.openai_url) if openai is not None else {})}

            def run(api: str, requests: list, c: int):
                if pool is None:
                    return asyncio.run(run_triton(server.grpc_url, requests, c, model, batched))
                url = server.openai_url if api == "openai" else server.grpc_url
                return spread(pool, client_processes, api, url, requests, c, model, batched)

            for i, (c, requests) in enumerate(zip(levels, level_requests)):
                systems = [(system, "triton", requests)]
                if openai is not None:
                    systems.append((openai_system, "openai", openai[1][i]))
                pooled = in_turns(systems, rounds[i] if rounds else 1, lambda api, reqs: run(api, reqs, c), scrape)
                for name, (results, elapsed, counters) in pooled.items():
                    engine = [counters.get((counter, model), 0.0) for counter in ENGINE_COUNTERS]
                    rows.append(summarize(name, c, results, elapsed, rag_bench.breakdown({}, counters).get(model),
                                          engine))
                    if name == openai_system:
                        rows[-1]["requests_per_worker"] = sorted(   # a worker replaced meanwhile: its series gone
                            (round(n) for (key, _), n in counters.items() if key == WORKER_REQUESTS and n > 0),
                            reverse=True)
                    print(rows[-1], flush=True)
    return rows


def worker_requests(frontend_url: str) -> dict[tuple[str, str], float]:
    """{(WORKER_REQUESTS, pid): requests answered} of each frontend worker, from the frontend's /metrics: how
    the kernel spread the benchmark's connections over the workers."""
    text = urllib.request.urlopen(f"{frontend_url}/metrics", timeout=10).read().decode()
    return {(WORKER_REQUESTS, pid or ""): float(value) for pid, value in re.findall(
        rf'^{WORKER_REQUESTS}(?:{{pid="(\d+)"}})? (\S+)$', text, re.MULTILINE)}


def within_target(through: float, alone: float) -> bool:
    """Issue 24's latency target: within 1.15x of in-process, or 2 ms, whichever is larger."""
    return through <= max(alone * TARGET_LATENCY_RATIO, alone + TARGET_LATENCY_SLACK_MS)


def own_share(frontend: dict, grpc: dict) -> str:
    """What the frontend itself adds to TTFT, apart from the engine's spread between the two systems: each
    one's client TTFT less the server's time to its first response (means), the frontend's over gRPC's."""
    try:
        ms = ((frontend["ttft_mean_ms"] - frontend["first_response_ms"])
              - (grpc["ttft_mean_ms"] - grpc["first_response_ms"]))
    except (KeyError, TypeError):   # no server metrics for a row
        return ""
    return f", the frontend's own share of TTFT (means, outside the server) {ms:+,.1f} ms"


def after_ramp(frontend: dict, grpc: dict) -> str:
    """The TTFT p50s of the requests after each level's ramp (summarize), against the same +5 ms."""
    o, t = frontend.get("ttft_after_ramp_p50_ms"), grpc.get("ttft_after_ramp_p50_ms")
    if o is None or t is None:   # a record from before the ramp was marked
        return ""
    if np.isnan(o) or np.isnan(t):   # every request was some round's ramp (as many rounds as streams fit)
        return ", after the ramp: no requests (fewer rounds or more requests per round give some)"
    met = "met" if o <= t + TARGET_OPENAI_TTFT_SLACK_MS else "MISSED"
    return f", after the ramp TTFT p50 {o:,.1f} vs {t:,.1f} ms ({o - t:+,.1f}: {met})"


def comparison(rows: list[dict], c: int) -> str:
    """One concurrency: each Triton system against in-process (issue 24's targets) and, when it ran,
    against the HF baseline; or each OpenAI frontend against gRPC directly on its server."""
    row = {r["system"]: r for r in rows if r["concurrency"] == c}
    tritons = [name for name in row if name == "triton" or name.startswith("triton x")]
    if any(name.startswith(OPENAI_SYSTEM) for name in row):
        parts = []
        for t in tritons:
            o = row[t.replace("triton", OPENAI_SYSTEM, 1)]
            t = row[t]
            share = o["tok_s"] / t["tok_s"]
            missed = [] if share >= TARGET_OPENAI_TOK_S_SHARE else ["tok/s"]
            missed += [] if o["ttft_p50_ms"] <= t["ttft_p50_ms"] + TARGET_OPENAI_TTFT_SLACK_MS else ["TTFT p50"]
            parts.append(f"c={c}: through the {o['system']} {100 * share:.0f}% of gRPC's tok/s, "
                         f"TTFT p50 {o['ttft_p50_ms']:,.1f} vs {t['ttft_p50_ms']:,.1f} ms "
                         f"({o['ttft_p50_ms'] - t['ttft_p50_ms']:+,.1f}), p99 {o['ttft_p99_ms']:,.1f} "
                         f"vs {t['ttft_p99_ms']:,.1f} ms (issue 22 targets: "
                         f"{'met' if not missed else 'MISSED ' + ', '.join(missed)}){after_ramp(o, t)}"
                         f"{own_share(o, t)}"
                         + (f", requests per worker {'/'.join(map(str, o['requests_per_worker']))}"
                            if o.get("requests_per_worker") else ""))
        return "; ".join(parts)
    p, hf = row["in-process"], row.get(HF_SYSTEM)
    parts = []
    for name in tritons:
        t = row[name]
        share = t["tok_s"] / p["tok_s"]
        missed = [] if share >= TARGET_TOK_S_SHARE else ["tok/s"]
        missed += [f"{label} {q}" for label, key in (("TTFT", "ttft"), ("ITL", "itl")) for q in ("p50", "p99")
                   if not within_target(t[f"{key}_{q}_ms"], p[f"{key}_{q}_ms"])]
        text = (f"c={c}: {name} {100 * share:.0f}% of in-process, TTFT p50 {t['ttft_p50_ms']:,.1f} vs "
                f"{p['ttft_p50_ms']:,.1f} ms, ITL p50 {t['itl_p50_ms']:,.1f} vs {p['itl_p50_ms']:,.1f} ms, "
                f"p99 {t['itl_p99_ms']:,.1f} vs {p['itl_p99_ms']:,.1f} ms (issue 24 targets: "
                f"{'met' if not missed else 'MISSED ' + ', '.join(missed)})")
        if hf and name == "triton":
            speedup = t["tok_s"] / hf["tok_s"]
            lower = t["ttft_p99_ms"] < hf["ttft_p99_ms"]
            text += (f", {speedup:.1f}x HF generate (target >= {TARGET_SPEEDUP}x: "
                     f"{'met' if speedup >= TARGET_SPEEDUP else 'MISSED'}), p99 TTFT {t['ttft_p99_ms']:,.0f} vs "
                     f"{hf['ttft_p99_ms']:,.0f} ms (lower: {'yes' if lower else 'NO'})")
        parts.append(text)
    return "; ".join(parts)


def per_level(parser, flag: str, value: str, levels: list[int]) -> list[int]:
    """A count for all concurrency levels, or one per level."""
    counts = [int(x) for x in value.split(",")]
    if len(counts) == 1:
        counts *= len(levels)
    if len(counts) != len(levels) or min(counts) < 1:
        parser.error(f"{flag} {value!r}: give one count >= 1, or one per --concurrency level ({len(levels)})")
    return counts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", default="200",
                        help="requests per concurrency: one count for all, or one per --concurrency level")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--prompt-len", default="128,1024", help="min,max prompt tokens")
    parser.add_argument("--output-len", default="128,512", help="min,max output tokens")
    parser.add_argument("--engine", default="{}", help="JSON of EngineConfig settings for both systems")
    parser.add_argument("--backend", default="{}",
                        help='JSON of triton_llm backend settings for the served llm, e.g. {"engine_process": false} '
                             "(the engine in a thread of the stub)")
    parser.add_argument("--baseline", choices=["hf"], help="also serve HF generate() in a plain Python model")
    parser.add_argument("--api", choices=["triton", "openai"], default="triton",
                        help="openai: the OpenAI frontend against gRPC directly, on one server (no in-process run)")
    parser.add_argument("--openai-workers", type=int, default=1,
                        help="with --api openai: the frontend's worker processes (ragstack serve --openai-workers)")
    parser.add_argument("--rounds", default="1",
                        help="with --api openai: each level's requests in this many rounds, gRPC and the frontend "
                             "taking turns (one count, or one per --concurrency level; default 1)")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="client processes sending each served system's requests, the streams shared out among "
                             "them, so that one client's event loop (parsing each response) is not what is measured "
                             "(default 4; the in-process run has no client)")
    parser.add_argument("--instances", default="1",
                        help="the llm's instance counts to serve, one server each, e.g. 1,4,8 (default: 1)")
    parser.add_argument("--baseline-batch-size", type=int,
                        help="the baseline's max_batch_size: most requests one generate() call takes; default: "
                             "the largest concurrency, so no request waits for a batch slot")
    parser.add_argument("--baseline-requests",
                        help="send the baseline only the first N requests (it is slow), one count or one per "
                             "level; default: as --num-requests")
    parser.add_argument("--json", type=Path)
    record.add_argument(parser, "serving")
    args = parser.parse_args(argv)

    import torch

    from llm_engine.config import EngineConfig
    from llm_engine.engine.async_engine import AsyncLLMEngine
    from llm_engine.engine.engine_process import torch_threads
    from llm_engine.model.tokenizer import Tokenizer

    if args.api == "openai" and args.baseline:
        parser.error("--api openai compares the frontend with gRPC directly: leave out --baseline")
    if args.openai_workers < 1 or args.client_processes < 1:
        parser.error("--openai-workers and --client-processes must be >= 1")
    settings = json.loads(args.engine)
    levels = [int(c) for c in args.concurrency.split(",")]
    counts = per_level(parser, "--num-requests", args.num_requests, levels)
    rounds = per_level(parser, "--rounds", args.rounds, levels)
    if args.api != "openai" and max(rounds) > 1:
        parser.error("--rounds takes turns between gRPC and the OpenAI frontend: give it with --api openai")
    if any(r > n for r, n in zip(rounds, counts)):
        parser.error(f"--rounds {args.rounds!r}: at most one round per request of the level ({args.num_requests})")
    baseline_counts = (counts if args.baseline_requests is None
                       else per_level(parser, "--baseline-requests", args.baseline_requests, levels))
    tokenizer = Tokenizer(args.model)
    sets = RequestSets(tokenizer, tuple(int(x) for x in args.prompt_len.split(",")),
                       tuple(int(x) for x in args.output_len.split(",")))
    level_requests = [sets.level(i, n) for i, n in enumerate(counts)]
    # The frontend shares a server (an engine) with gRPC: requests of its own, the same lengths.
    openai = ((sets.warm_up(2 * args.openai_workers, variant=1), [sets.level(i, n, variant=1)
                                                                  for i, n in enumerate(counts)])
              if args.api == "openai" else None)
    served = {**settings, **json.loads(args.backend)}
    try:
        instance_counts = [int(k) for k in args.instances.split(",")]
    except ValueError:
        instance_counts = []
    if not instance_counts or min(instance_counts) < 1 or len(set(instance_counts)) < len(instance_counts):
        parser.error(f"--instances {args.instances!r}: give distinct counts >= 1, e.g. 1,4,8")
    rows = []
    for k in instance_counts:
        rows += serve(lambda dest, k=k: write_repository(dest, args.model, served, k), "llm", triton_system(k),
                      levels, level_requests, openai=openai,
                      openai_system=triton_system(k).replace("triton", OPENAI_SYSTEM, 1),
                      openai_workers=args.openai_workers, client_processes=args.client_processes, rounds=rounds)
    if args.baseline:
        batch_size = args.baseline_batch_size or max(levels)
        rows += serve(lambda dest: write_hf_baseline(dest, args.model, batch_size), "hf_generate",
                      HF_SYSTEM, levels, [r[:m] for r, m in zip(level_requests, baseline_counts)],
                      batched=True)

    async def in_process():
        config = EngineConfig(model=args.model, **settings)
        torch.set_num_threads(torch_threads(config))  # as many as the served engine process uses
        engine = AsyncLLMEngine.from_config(config)
        try:
            await run_in_process(engine, sets.warm_up(2), 2)  # warm-up, as the server's load does
            for c, requests in zip(levels, level_requests):
                before = engine.get_stats()
                results, elapsed = await run_in_process(engine, requests, c)
                after = engine.get_stats()
                counts = (after.num_prompt_tokens - before.num_prompt_tokens,
                          sum(r.prompt_tokens for r in results), after.num_preemptions - before.num_preemptions)
                rows.append(summarize("in-process", c, results, elapsed, engine=counts))
                print(rows[-1], flush=True)
        finally:
            engine.shutdown(timeout=0)
    if args.api == "triton":
        asyncio.run(in_process())

    table = [table_row(r) for r in rows]
    ratios = [comparison(rows, c) for c in levels]
    print(markdown(table))
    print("; ".join(ratios))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.record:
        record.write(args.record, __file__, argv, args, machine(settings.get("device", "auto")), table, ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
