"""Host time per engine step, by phase, with async scheduling on and off, in one run.

Decode-heavy steps: --batch requests of a 128-token prompt and --output-tokens greedy tokens
(ignore_eos), all admitted at once. Each phase is timed by wrapping the engine's methods:
schedule; account (advance + resolve: placeholders, then the sampled tokens put in place);
prepare (the packed step inputs); upload (host-to-device copy, placeholders filled); forward
(run_step); sample; wait (for the sampled ids on the host); emit (detokenize, outputs); other
(the rest of step()). Each figure is the median over the decode steps (robust to a busy machine).

On the CPU, forward and sample are the computation itself, so the device never overlaps the host;
what the run shows is the host's own cost per step and, with async scheduling off, the part of it
that sits between a step's sampled ids and the next launch (account + schedule + prepare +
upload): on a GPU that part is device idle time, which async scheduling hides while the host's
total stays below the device's step time. On a GPU, forward and sample are launches and wait is
the time the host blocks for the device.

    python -m benchmarks.bench_step_host --model checkpoints/tiny-llama --batch 1,64
"""
from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded

PHASES = ["schedule", "account", "prepare", "upload", "forward", "sample", "wait", "emit"]


def timed(owner, name: str, phase: str, totals: dict) -> None:
    """Replace owner.name by a wrapper adding its run time to totals[phase]."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


def instrument(engine) -> dict[str, float]:
    """Time the engine's step phases (PHASES) into the returned totals, which the caller clears;
    uninstrument() undoes the one class-level wrapper."""
    from llm_engine.worker.host_copy import HostCopy

    totals: dict[str, float] = defaultdict(float)
    sched, runner = engine.scheduler, engine.model_runner
    timed(sched, "schedule", "schedule", totals)
    timed(sched, "advance", "account", totals)
    timed(sched, "resolve", "account", totals)
    timed(runner, "prepare_step", "prepare", totals)
    timed(runner, "upload_step", "upload", totals)
    timed(runner, "run_step", "forward", totals)
    timed(engine, "sampler", "sample", totals)
    timed(engine, "_emit", "emit", totals)
    timed(HostCopy, "wait", "wait", totals)
    return totals


def uninstrument() -> None:
    from llm_engine.worker.host_copy import HostCopy

    HostCopy.wait = HostCopy.wait.__wrapped__


def measure(model: str, device: str, batch: int, output_tokens: int, async_scheduling: bool) -> dict:
    from llm_engine import LLM, SamplingParams

    max_len = 128 + output_tokens
    # Room for every sequence at once (no preemption), a single prefill step.
    llm = LLM(model, device=device, max_model_len=max_len, max_num_seqs=batch, max_num_batched_tokens=max(2048, 128 * batch),
              cpu_kv_cache_tokens=batch * (max_len + 16), async_scheduling=async_scheduling)
    engine = llm.engine
    vocab = engine.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(128)] for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up

    totals = instrument(engine)
    try:
        for i, ids in enumerate(prompts):
            engine.add_request(f"r{i}", ids, params)
        engine.step()  # the prefill: not a decode step
        async_before = engine.get_stats().num_async_steps
        per_step = []
        while engine.has_unfinished_requests():
            totals.clear()
            t0 = time.perf_counter()
            engine.step()
            wall = time.perf_counter() - t0
            per_step.append({"wall": wall, **{p: totals[p] for p in PHASES},
                             "other": wall - sum(totals[p] for p in PHASES)})
    finally:
        uninstrument()
    async_steps = engine.get_stats().num_async_steps - async_before
    # The next setting's engine sizes its KV pool from the GPU memory left: give this one's back
    # (the timing wrappers make reference cycles, so only the collector frees it).
    llm.close()
    del llm, engine
    gc.collect()
    torch.cuda.empty_cache()
    ms = {key: 1e3 * statistics.median(step[key] for step in per_step) for key in per_step[0]}
    return {"mode": "async" if async_scheduling else "sync", "batch": batch, "steps": len(per_step), **ms,
            "async_steps": async_steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF model folder (checkpoints/tiny-llama, or a large one)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch", default="1,64", help="comma-separated numbers of concurrent requests")
    parser.add_argument("--output-tokens", type=int, default=128)
    record.add_argument(parser, "step_host")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    rows = [table_row(measure(args.model, args.device, int(b), args.output_tokens, a))
            for b in args.batch.split(",") for a in (False, True)]
    print(markdown(rows))
    if args.record:
        notes = [f"model {Path(args.model).name}, {torch.get_num_threads()} torch threads"]
        record.write(args.record, __file__, argv, args, machine(args.device), rows, notes)
    return 0


def table_row(r: dict) -> dict:
    """Milliseconds to the microsecond; with async scheduling off, also the host work between a step's
    sampled ids and the next launch (device idle time on a GPU)."""
    gap = r["account"] + r["schedule"] + r["prepare"] + r["upload"] if r["mode"] == "sync" else None
    return {"mode": r["mode"], "batch": r["batch"], "decode steps": r["steps"], "async steps": r["async_steps"],
            **{f"{c} ms": round(r[c], 3) for c in ["wall", *PHASES, "other"]},
            "host between ids and next launch, sync ms": rounded(gap, 3)}


if __name__ == "__main__":
    raise SystemExit(main())
