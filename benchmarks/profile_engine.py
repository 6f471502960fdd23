r"""Where the engine's step time goes on the GPU: a window of steps of a bench_engine workload under
torch.profiler (CUDA activity only, so the host runs at its normal speed), kernels grouped by name,
device busy time against wall time, and the shape of the steps in the window.

    python -m benchmarks.profile_engine --model /tmp/l8b --workload b --steps 300:340
    python -m benchmarks.profile_engine --model /tmp/l8b --workload a --steps 100:140 \
        --engine '{"max_num_batched_tokens": 8192}'

Requests are added as a streaming server adds them (an output per token), or with --final-only as
LLM.generate and bench_engine add them (one output at the end). The same number of steps
just before the window runs unprofiled: its wall time per step is the comparison that says whether
the device or the host sets the pace.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_engine import make_workload
from benchmarks.bench_step_host import PHASES, instrument, uninstrument
from llm_engine.kernels.launch_config import override_launch_params

# Kernel-name fragments of the matrix multiplications (cuBLAS / CUTLASS; nvjet is cuBLAS on Hopper).
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "xmma", "splitk", "gemv")


def device_intervals(trace_path: Path) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of every kernel, copy and memset in a chrome trace."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    return [(e["name"], float(e["ts"]), float(e["dur"])) for e in events
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]


def busy_us(intervals: list[tuple[str, float, float]]) -> float:
    """Time during which at least one kernel or copy ran (their union)."""
    total, end = 0.0, -np.inf
    for _, ts, dur in sorted(intervals, key=lambda x: x[1]):
        if ts + dur > end:
            total += ts + dur - max(ts, end)
            end = ts + dur
    return total


def category(name: str) -> str:
    low = name.lower()
    if any(k in low for k in GEMM_NAMES):
        return "matmul (cuBLAS)"
    if "memcpy" in low or "memset" in low:
        return "copies"
    return name[:60]


def memory_counters() -> dict[str, int]:
    """cudaMalloc / cudaFree calls and the retries after freeing the cache (each synchronises the
    device): a near-full GPU makes the allocator do them during steps."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: stats.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", choices=("a", "b", "c"), default="b")
    parser.add_argument("--num-requests", type=int, default=1000, help="requests in workload b")
    parser.add_argument("--steps", default="300:340", help="profiled window, START:END engine steps")
    parser.add_argument("--engine", default="{}", help="EngineConfig overrides as JSON")
    parser.add_argument("--launch", default="{}",
                        help='launch-config overrides as JSON, {"kernel": {"param": value}} (sweeps without editing '
                             'launch_configs/)')
    parser.add_argument("--final-only", action="store_true",
                        help="add the requests as LLM.generate does: no per-token outputs")
    parser.add_argument("--max-model-len", type=int, default=17408)
    parser.add_argument("--top", type=int, default=25, help="kernel rows to print")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also run the unprofiled window under cProfile and print its N costliest functions")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    start, end = (int(x) for x in args.steps.split(":"))
    if not 0 < end - start <= start:
        parser.error("--steps needs START >= END - START > 0 (the unprofiled comparison window precedes it)")

    with contextlib.ExitStack() as stack:
        for kernel, params in json.loads(args.launch).items():
            stack.enter_context(override_launch_params(kernel, **params))
        return profile(args, start, end)


def profile(args, start: int, end: int) -> int:
    from llm_engine import SamplingParams
    from llm_engine.config import EngineConfig
    from llm_engine.engine.llm_engine import start_engine

    overrides = json.loads(args.engine)
    settings = {"dtype": "bfloat16", "max_model_len": args.max_model_len, "max_waiting": None, **overrides}
    engine = start_engine(EngineConfig(model=args.model, **settings))
    vocab = engine.vocab_size
    for i, (ids, out) in enumerate(make_workload(args.workload, vocab, args.num_requests)):
        engine.add_request(f"r{i}", prompt_token_ids=ids,
                           sampling_params=SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True),
                           final_only=args.final_only)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    shapes, wall = [], {}
    totals = instrument(engine)
    python_prof = cProfile.Profile()
    activities = torch.profiler.ProfilerActivity
    activity = activities.CUDA if torch.cuda.is_available() else activities.CPU
    prof = torch.profiler.profile(activities=[activity])
    step = 0
    while engine.has_unfinished_requests() and step < end:
        if step in (2 * start - end, start):
            sync()
            allocator = memory_counters()
            if step == start:
                wall["unprofiled"] = time.perf_counter() - t0
                host = {p: totals[p] for p in PHASES}
                if args.cprofile:
                    python_prof.disable()
                prof.start()
            elif args.cprofile:
                python_prof.enable()
            totals.clear()
            t0 = time.perf_counter()
        engine.step()
        in_flight = engine._in_flight  # the step this call launched (async scheduling)
        launched = in_flight.batch if in_flight is not None else None
        if step >= start and launched is not None:
            decode_context = sum(s.num_computed_tokens + 1 for s, n in zip(launched.seqs, launched.num_new_tokens)
                                 if n == 1)
            shapes.append((len(launched.seqs), launched.num_tokens,
                           sum(1 for n in launched.num_new_tokens if n == 1), decode_context))
        step += 1
    sync()
    if step < end:
        raise SystemExit(f"the workload ended after {step} steps, before the window {args.steps} did")
    wall["profiled"] = time.perf_counter() - t0
    allocator = {k: v - allocator[k] for k, v in memory_counters().items()}
    prof.stop()
    uninstrument()
    engine.close()

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        intervals = device_intervals(trace)
    n = end - start
    busy = max(busy_us(intervals) / n, 1e-9)  # (no device events on the CPU)
    by_name: dict[str, list[float]] = {}
    for name, _, dur in intervals:
        by_name.setdefault(category(name), []).append(dur)
    rows = sorted(((k, sum(v) / n, len(v) / n) for k, v in by_name.items()), key=lambda r: -r[1])
    if not shapes:
        raise SystemExit(f"no step was launched in the window {args.steps}")
    seqs, tokens, decodes, decode_context = (np.mean(c) for c in zip(*shapes))
    # KV bytes the decode attention reads per step: every cached token's K and V in every layer
    # (an FP8 cache also its float32 scale per token and head).
    cfg, kv_dtype = engine.config.model_config, engine.config.kv_cache_torch_dtype
    per_head = cfg.head_dim * torch.empty(0, dtype=kv_dtype).element_size() + 4 * (kv_dtype == torch.float8_e4m3fn)
    kv_bytes = decode_context * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * per_head
    decode_us = sum(sum(v) for k, v in by_name.items() if "decode" in k) / n
    print(f"workload {args.workload}{' (final-only)' if args.final_only else ''}, engine {overrides}, "
          f"launch {args.launch}, steps {args.steps}: {seqs:.0f} sequences, "
          f"{tokens:.0f} tokens ({decodes:.0f} decodes, {decode_context / max(decodes, 1):.0f} context tokens each) "
          f"per step on average")
    print(f"wall per step: unprofiled {1e3 * wall['unprofiled'] / n:.2f} ms, profiled {1e3 * wall['profiled'] / n:.2f}"
          f" ms; device busy {busy / 1e3:.2f} ms per step; decode attention reads {kv_bytes / 1e9:.2f} GB per step"
          + (f" ({kv_bytes / decode_us / 1e3:,.0f} GB/s)" if decode_us else ""))
    print("CUDA caching allocator over the profiled window: " + ", ".join(f"{k} {v}" for k, v in allocator.items()))
    print(f"host per step, unprofiled{' (under cProfile)' if args.cprofile else ''}: "
          + ", ".join(f"{p} {1e3 * host[p] / n:.2f}" for p in PHASES)
          + f", other {1e3 * (wall['unprofiled'] - sum(host.values())) / n:.2f} ms")
    print("| kernel | ms per step | launches per step | share of busy |\n|---|---|---|---|")
    for name, us, count in rows[:args.top]:
        print(f"| {name} | {us / 1e3:.3f} | {count:.1f} | {100 * us / busy:.1f}% |")
    if args.cprofile:
        print(f"\nPython functions over the unprofiled window (cProfile, {n} steps; its overhead slows them):")
        pstats.Stats(python_prof).sort_stats("tottime").print_stats(args.cprofile)
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "engine": overrides, "steps": args.steps,
                                         "mean_shape": [seqs, tokens, decodes], "wall_s": wall,
                                         "busy_us_per_step": busy, "host_s": host, "kernels": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
