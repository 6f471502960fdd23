"""Load and overload test of the serving stack (issue 8): N concurrent streaming llm requests and M
concurrent rag queries at once over gRPC (one stream per request), every request followed to its
end (exactly one FINAL, or an error; hung, lost and duplicated ones counted); throughput and p99;
the server's memory (tritonserver and its Python stubs) before, at peak and after. Then a burst
beyond llm_small_queue's queue (tests/fixtures): refusals at once, admitted latency bounded, served
again afterwards. Starts its own server (project repositories plus tests/fixtures/model_repository)
unless --url is given; prints one table and records it.

    python -m benchmarks.load_test [--llm 1000] [--rag 200] [--url localhost:8001 --server-pid PID]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded
from ragstack import load_gen, process_tree
from ragstack.launcher import DEFAULT_REPOSITORIES, ServerOptions, TritonServer, free_port

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
MEMORY_TOLERANCE = (0.10, 150 * MiB)  # after - before must stay under max(10% of before, 150 MiB)


async def with_progress(coro, pid: int | None, counter: list[int]):
    """Runs `coro`, printing every 5 s how many responses have come and the server's memory."""
    task = asyncio.ensure_future(coro)
    start = time.monotonic()
    while not task.done():
        await asyncio.wait([task], timeout=5)
        memory = f", server {process_tree.tree_rss_bytes(pid) / MiB:.0f} MiB" if pid else ""
        print(f"  {time.monotonic() - start:5.0f} s: {counter[0]} responses{memory}", flush=True)
    return task.result()


def table_rows(load: dict, memory: tuple | None, over: dict | None) -> list[dict]:
    """A row for each kind of request, one for the server's memory and one for the overload burst;
    printed transposed (a column each)."""
    rows = [{"load": name, "requests at once": s["requests"], "ok (one FINAL)": s["ok"], "errors": s["error"],
             "hung": s["hung"], "lost": s["lost"], "duplicate": s["duplicate"],
             "errors by message": "; ".join(f"{n}x {m}" for m, n in s["errors"].items()) or None,
             "completed requests/s": rounded(s["per_s"], 1), "latency p50 ms": rounded(s["p50_ms"]),
             "latency p99 ms": rounded(s["p99_ms"]), "first response p99 ms": rounded(s["first_p99_ms"])}
            for name, s in (("llm (streaming)", load["llm"]), ("rag (ensemble)", load["rag"]))]
    if memory:
        rows.append({"load": "server memory", **{f"memory {when} MiB": round(m / MiB)
                                                 for when, m in zip(("before", "peak", "after"), memory)}})
    if over:
        rows.append({"load": "overload: burst on llm_small_queue", "requests at once": over["burst"],
                     "admitted": over["admitted"], "refused": over["refused"], "other": over["other"],
                     "refusal message": "; ".join(over["errors"]) or None,
                     "slowest refusal ms": rounded(over["refused_max_ms"]),
                     "alone ms": rounded(over["alone"].seconds * 1e3),
                     "admitted p99 ms": rounded(over["admitted_p99_ms"]),
                     "after ms": rounded(over["after"].seconds * 1e3)})
    return rows


def verdicts(load: dict, memory: tuple | None, over: dict | None) -> list[str]:
    """What failed; empty when everything held."""
    failed = [f"{kind}: {s[k]} {k}" for kind, s in load.items() for k in ("hung", "lost", "duplicate") if s[k]]
    if memory:
        before, _, after = memory
        if after - before >= max(MEMORY_TOLERANCE[0] * before, MEMORY_TOLERANCE[1]):
            failed.append(f"memory did not return near its baseline: {before / MiB:.0f} -> {after / MiB:.0f} MiB")
    if over:
        if over["other"] or not over["refused"]:
            failed.append(f"overload: {over['refused']} refused, {over['other']} neither admitted nor refused")
        if over["after"].status != "ok" or over["alone"].status != "ok":
            failed.append("overload: a request alone failed")
        elif over["admitted_p99_ms"] / 1e3 > 6 * over["alone"].seconds + 1.0:
            failed.append("overload: admitted latency not bounded by the queue")
    return failed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", type=int, default=1000, help="concurrent streaming llm requests")
    parser.add_argument("--rag", type=int, default=200, help="concurrent rag queries")
    parser.add_argument("--llm-tokens", type=int, default=16, help="tokens per llm answer (greedy, EOS ignored)")
    parser.add_argument("--rag-tokens", type=int, default=16, help="tokens per rag answer")
    parser.add_argument("--burst", type=int, default=200, help="overload: requests at once on llm_small_queue")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a request counts as hung")
    parser.add_argument("--url", help="gRPC address of a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, help="with --url: the tritonserver pid, to measure its memory")
    record.add_argument(parser, "load")
    args = parser.parse_args(argv)

    server = None
    if args.url is None:
        server = TritonServer(ServerOptions(
            model_repositories=[*DEFAULT_REPOSITORIES, ROOT / "tests" / "fixtures" / "model_repository"],
            http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()))
        print("starting the server ...", flush=True)
        server.start()
    url = args.url or server.grpc_url
    pid = server.process.pid if server else args.server_pid
    try:
        # The same load once before measuring: what its first run keeps for good (allocators' and ONNX
        # Runtime's high-water marks, lazily built state) belongs to the baseline; a leak grows per run.
        print(f"warm-up: the same load once ({args.llm} llm requests, {args.rag} rag queries)", flush=True)
        asyncio.run(load_gen.mixed(url, args.llm, args.rag, args.llm_tokens, args.rag_tokens, timeout_s=args.timeout))
        time.sleep(5)
        before = process_tree.tree_rss_bytes(pid) if pid else None
        print(f"load: {args.llm} llm requests and {args.rag} rag queries at once", flush=True)
        counter = [0]

        def count(_):
            counter[0] += 1

        with process_tree.PeakSampler(pid) if pid else contextlib.nullcontext() as sampler:
            load = asyncio.run(with_progress(load_gen.mixed(url, args.llm, args.rag, args.llm_tokens, args.rag_tokens,
                                                            timeout_s=args.timeout, on_response=count), pid, counter))
        time.sleep(5)  # finished sequences freed, the stubs' garbage collected
        memory = (before, sampler.bytes, process_tree.tree_rss_bytes(pid)) if pid else None
        over = None
        if args.burst:
            print(f"overload: {args.burst} requests at once on llm_small_queue", flush=True)
            over = asyncio.run(load_gen.overload(url, "llm_small_queue", args.burst, 20, args.timeout))
    finally:
        if server:
            server.stop()

    rows = table_rows(load, memory, over)
    failed = verdicts(load, memory, over)
    notes = (f"{args.llm_tokens}-token llm answers, {args.rag_tokens}-token rag answers (greedy, EOS ignored), all "
             "requests sent at once, one gRPC stream each; latency from sending to the FINAL response. Memory: the "
             "resident sets of tritonserver and its Python stubs summed (shared memory counted in each), before = "
             "after a warm-up run of the same load, after = 5 s after the measured run. A gRPC stream's error "
             "carries no status code (nor does Triton 2.51's HTTP generate, which answers 400 to any model error), "
             "so refusals are told by message. "
             + ("Every check held." if not failed else "Failed: " + "; ".join(failed) + "."))
    print(markdown(rows, transpose=True))
    print(notes)
    if args.record:
        record.write(args.record, __file__, argv, args, machine(), rows, [notes])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
