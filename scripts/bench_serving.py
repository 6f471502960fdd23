"""Serving benchmark: the same requests through the real Triton server (gRPC streaming, the llm
model) and through the engine in-process (AsyncLLMEngine), side by side in one run.

The script writes a temporary model repository whose `llm` runs --model with the given engine
settings, starts the server with the launcher, sends N requests at each concurrency, stops it,
then replays the same requests in-process. Rows: output tok/s, TTFT and inter-token p50/p99.

    python scripts/bench_serving.py --model /tmp/llama3-8b --num-requests 200 --concurrency 1,16,64
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    ttft: float
    gaps: list[float]
    tokens: int


def percentile_ms(values, q):
    return float(np.percentile(values, q) * 1e3) if values else float("nan")


def make_requests(tokenizer, n: int, prompt_range, output_range, seed=0):
    """Prompts decoded from random ids; their token counts are reported by the server."""
    rng = random.Random(seed)
    vocab = tokenizer.vocab_size
    out = []
    for _ in range(n):
        ids = [rng.randrange(10, vocab - 10) for _ in range(rng.randint(*prompt_range))]
        out.append((tokenizer.decode(ids), rng.randint(*output_range)))
    return out


async def run_triton(url: str, requests, concurrency: int) -> tuple[list[Result], float]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)
    sem = asyncio.Semaphore(concurrency)

    def inputs(prompt: str, max_tokens: int):
        tensors = []
        for name, value, dtype in (
                ("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
                ("stream", np.array([True]), "BOOL"),
                ("sampling_parameters", np.array([json.dumps({"temperature": 0.0, "max_tokens": max_tokens,
                                                              "ignore_eos": True}).encode()], dtype=np.object_),
                 "BYTES"),
                ("return_num_output_tokens", np.array([True]), "BOOL")):
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(value)
            tensors.append(t)
        return tensors

    async def one(i: int, prompt: str, max_tokens: int) -> Result:
        async with sem:
            async def gen():
                yield {"model_name": "llm", "inputs": inputs(prompt, max_tokens), "request_id": str(i)}
            start = time.perf_counter()
            times, tokens = [], 0
            async for result, error in client.stream_infer(gen()):
                if error is not None:
                    raise RuntimeError(f"request {i}: {error}")
                times.append(time.perf_counter())
                tokens += int(result.as_numpy("num_output_tokens")[0])
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            return Result(times[0] - start, list(np.diff(times)), tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, p, o) for i, (p, o) in enumerate(requests)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return results, elapsed


async def run_in_process(engine, requests, concurrency: int) -> tuple[list[Result], float]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: str, max_tokens: int) -> Result:
        async with sem:
            start = time.perf_counter()
            times, tokens = [], 0
            params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
            async for out in engine.add_request(f"r{i}-{concurrency}", prompt, params):
                if out.delta_text or out.finished:  # the server sends a response exactly then
                    times.append(time.perf_counter())
                tokens = len(out.token_ids)
            return Result(times[0] - start, list(np.diff(times)), tokens)

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i, p, o) for i, (p, o) in enumerate(requests)))
    return results, time.perf_counter() - t0


def summarize(system: str, concurrency: int, results: list[Result], elapsed: float) -> dict:
    tokens = sum(r.tokens for r in results)
    ttft = [r.ttft for r in results]
    gaps = [g for r in results for g in r.gaps]
    return {"system": system, "concurrency": concurrency, "requests": len(results), "output_tokens": tokens,
            "seconds": elapsed, "tok_s": tokens / elapsed, "ttft_p50_ms": percentile_ms(ttft, 50),
            "ttft_p99_ms": percentile_ms(ttft, 99), "itl_p50_ms": percentile_ms(gaps, 50),
            "itl_p99_ms": percentile_ms(gaps, 99)}


def write_repository(dest: Path, model: str, settings: dict) -> None:
    """The project's llm config, its engine settings replaced by this run's (engine.json wins)."""
    llm = dest / "llm"
    (llm / "1").mkdir(parents=True)
    shutil.copy(ROOT / "model_repository" / "llm" / "config.pbtxt", llm / "config.pbtxt")
    (llm / "1" / "engine.json").write_text(json.dumps({"model": str(Path(model).resolve()), **settings}))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--prompt-len", default="128,1024", help="min,max prompt tokens")
    parser.add_argument("--output-len", default="128,512", help="min,max output tokens")
    parser.add_argument("--engine", default="{}", help="JSON of EngineConfig settings for both systems")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--record", default=str(ROOT / "docs" / "benchmarks.md"))
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT / "clients"))
    from llm_engine.async_engine import AsyncLLMEngine
    from llm_engine.config import EngineConfig
    from llm_engine.tokenizer import Tokenizer
    from ragstack.launcher import ServerOptions, TritonServer, free_port

    settings = json.loads(args.engine)
    levels = [int(c) for c in args.concurrency.split(",")]
    tokenizer = Tokenizer(args.model)
    requests = make_requests(tokenizer, args.num_requests, [int(x) for x in args.prompt_len.split(",")],
                             [int(x) for x in args.output_len.split(",")])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_repository(Path(tmp), args.model, settings)
        options = ServerOptions(model_repositories=[Path(tmp)], models=["llm"], http_port=free_port(),
                                grpc_port=free_port(), metrics_port=free_port(), startup_timeout_s=900)
        load_start = time.perf_counter()
        with TritonServer(options) as server:
            print(f"server ready in {time.perf_counter() - load_start:.1f} s", flush=True)
            for c in levels:
                rows.append(summarize("triton", c, *asyncio.run(run_triton(server.grpc_url, requests, c))))
                print(rows[-1], flush=True)

    async def in_process():
        engine = AsyncLLMEngine.from_config(EngineConfig(model=args.model, **settings))
        try:
            await run_in_process(engine, requests[:2], 2)  # warm-up, as the server's load does
            for c in levels:
                rows.append(summarize("in-process", c, *await run_in_process(engine, requests, c)))
                print(rows[-1], flush=True)
        finally:
            engine.shutdown(timeout=0)
    asyncio.run(in_process())

    table = ["| system | concurrency | requests | output tok | tok/s | TTFT p50/p99 ms | ITL p50/p99 ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['system']} | {r['concurrency']} | {r['requests']} | {r['output_tokens']} | "
                     f"{r['tok_s']:,.0f} | {r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                     f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} |")
    ratios = []
    for c in levels:
        t = next(r for r in rows if r["system"] == "triton" and r["concurrency"] == c)
        p = next(r for r in rows if r["system"] == "in-process" and r["concurrency"] == c)
        ratios.append(f"c={c}: Triton {100 * t['tok_s'] / p['tok_s']:.0f}% of in-process")
    text = "\n".join(table)
    print(text)
    print("; ".join(ratios))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.record:
        try:
            import torch
            machine = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "CPU"
        except ImportError:
            machine = "CPU"
        commit = (subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip() or os.environ.get("RAGSTACK_COMMIT", "unknown"))
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(args.record, "a") as f:
            f.write(f"\n## LLM through Triton vs in-process ({stamp})\n\nMachine: {machine}, {platform.node()}; "
                    f"commit {commit}; command: `python scripts/bench_serving.py {' '.join(argv)}`\n\n"
                    f"{text}\n\n{'; '.join(ratios)}.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
