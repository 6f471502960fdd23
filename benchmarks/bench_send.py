"""The response path's floor: how many decoupled responses one Python-backend stub sends per second in
Triton 2.51, and what that means for the llm's streams. No engine: the model `send_rate`
(benchmarks/serving_baselines/send_rate) sends each stream one small response per round, as the llm
sends a token per engine step, from one thread per instance (triton_llm sends every response from its
loop thread).

Three modes, each at every --streams count and every --instances count (one server per count, the
streams spread over the instances by Triton's scheduler):
- flood: rounds back to back, `--flood-responses` responses in all: the stubs' send rate (responses/s
  at the client), the wall and CPU microseconds one `send()` takes in the stub, and the round time
  those imply for 256 streams;
- paced: a round every --step-ms (an engine step of the 8B model on the H200 at 256 streams is ~14 ms),
  with `is_cancelled()` every 20 ms per stream as the llm asks it: the gaps between a stream's
  responses at the client (p50/p99), against the step;
- paced-nocheck: the same without `is_cancelled()`, for its share of the cost.

    python -m benchmarks.bench_send --instances 1,2,4 --streams 1,16,64,256
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import string
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded

MODEL_DIR = Path(__file__).resolve().parent / "serving_baselines" / "send_rate"
LLM_CANCEL_CHECK_MS = 20.0  # backends/triton_llm/model.py CANCEL_CHECK_INTERVAL_S
MODES = ("flood", "paced", "paced-nocheck")


def write_repository(dest: Path, instances: int) -> None:
    folder = dest / "send_rate"
    (folder / "1").mkdir(parents=True)
    template = string.Template((MODEL_DIR / "config.pbtxt.template").read_text())
    (folder / "config.pbtxt").write_text(template.substitute(instances=instances))
    shutil.copy(MODEL_DIR / "model.py", folder / "1" / "model.py")


def request_proto(i: int, responses: int, step_ms: float, cancel_check_ms: float):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="send_rate", id=str(i))
    for name, datatype, value in (("responses", "INT32", responses), ("step_ms", "FP32", step_ms),
                                  ("cancel_check_ms", "FP32", cancel_check_ms)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1])
        if datatype == "INT32":
            tensor.contents.int_contents.append(value)
        else:
            tensor.contents.fp32_contents.append(value)
    return request


async def run_streams(url: str, streams: int, responses: int, step_ms: float, cancel_check_ms: float,
                      channels: int = 4) -> dict:
    """`streams` requests at once, each read to its FINAL: arrival times per stream, and the stub's
    own counts from each FINAL."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    opened = [grpc.aio.insecure_channel(url) for _ in range(channels)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in opened]

    async def one(i: int):
        async def gen():
            yield request_proto(i, responses, step_ms, cancel_check_ms)
        times, stats = [], None
        async for response in stubs[i % channels].ModelStreamInfer(gen(), timeout=600):
            times.append(time.perf_counter())
            if response.error_message:
                raise RuntimeError(f"stream {i}: {response.error_message}")
            out = response.infer_response
            names = [o.name for o in out.outputs]
            if "send_stats" in names:
                raw = out.raw_output_contents[names.index("send_stats")]
                stats = json.loads(raw[4:].decode())   # BYTES: a 4-byte length, then the bytes
                break
        return times, stats

    start = time.perf_counter()
    try:
        results = await asyncio.gather(*(one(i) for i in range(streams)))
    finally:
        for c in opened:
            await c.close()
    wall = time.perf_counter() - start
    gaps = [g for times, _ in results for g in np.diff(times)]
    stats = [s for _, s in results]
    received = sum(len(times) for times, _ in results)
    # The FINAL's own send is not in its stats (it is timed after they were written).
    sends = sum(s["sends"] for s in stats) - len(stats)
    send_s = sum(s["send_s"] for s in stats)
    checks = sum(s["checks"] for s in stats)
    per_instance = Counter(s["instance"] for s in stats)
    return {"received": received, "wall_s": wall, "per_s": received / wall, "send_us": 1e6 * send_s / max(sends, 1),
            "send_cpu_us": 1e6 * sum(s["send_cpu_s"] for s in stats) / max(sends, 1),
            "check_us": 1e6 * sum(s["check_s"] for s in stats) / checks if checks else float("nan"),
            "gap_p50_ms": float(np.percentile(gaps, 50) * 1e3) if gaps else float("nan"),
            "gap_p99_ms": float(np.percentile(gaps, 99) * 1e3) if gaps else float("nan"),
            "busiest_instance_share": max(per_instance.values()) / streams}


def row(mode: str, instances: int, streams: int, step_ms: float, r: dict) -> dict:
    return {"mode": mode, "instances": instances, "streams": streams, "step ms": step_ms or None,
            "responses": r["received"], "responses/s": rounded(r["per_s"]),
            "send µs (stub wall)": rounded(r["send_us"], 1), "send µs (stub CPU)": rounded(r["send_cpu_us"], 1),
            "is_cancelled µs": rounded(r["check_us"], 1),
            "gap p50 ms": rounded(r["gap_p50_ms"], 2), "gap p99 ms": rounded(r["gap_p99_ms"], 2),
            "busiest instance %": rounded(100 * r["busiest_instance_share"])}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", default="1,2,4", help="model instances (stubs), one server per count")
    parser.add_argument("--streams", default="1,16,64,256")
    parser.add_argument("--flood-responses", type=int, default=20000, help="responses per flood run, all streams")
    parser.add_argument("--step-ms", type=float, default=14.0, help="the paced runs' round interval")
    parser.add_argument("--paced-responses", type=int, default=100, help="responses per stream in a paced run")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--json", type=Path)
    record.add_argument(parser, "send")
    args = parser.parse_args(argv)

    from ragstack.launcher import ServerOptions, TritonServer, free_port

    levels = [int(s) for s in args.streams.split(",")]
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        parser.error(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    rows, raw = [], []
    for instances in [int(k) for k in args.instances.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            write_repository(Path(tmp), instances)
            options = ServerOptions(model_repositories=[Path(tmp)], models=["send_rate"], http_port=free_port(),
                                    grpc_port=free_port(), metrics_port=free_port(), startup_timeout_s=120)
            with TritonServer(options) as server:
                asyncio.run(run_streams(server.grpc_url, 8, 50, 0.0, 0.0))  # warm-up
                for streams in levels:
                    for mode, step_ms, count, check in (
                            ("flood", 0.0, max(20, args.flood_responses // streams), 0.0),
                            ("paced", args.step_ms, args.paced_responses, LLM_CANCEL_CHECK_MS),
                            ("paced-nocheck", args.step_ms, args.paced_responses, 0.0)):
                        if mode not in modes:
                            continue
                        r = asyncio.run(run_streams(server.grpc_url, streams, count, step_ms, check))
                        raw.append({"mode": mode, "instances": instances, "streams": streams, **r})
                        rows.append(row(mode, instances, streams, step_ms, r))
                        print(rows[-1], flush=True)
    notes = []
    for r in raw:
        if r["mode"] == "flood" and r["streams"] == max(levels):
            per_s = 1e6 / r["send_us"] * r["instances"]
            need = 256 / (args.step_ms / 1e3)
            notes.append(f"{r['instances']} instance(s): a send takes {r['send_us']:.0f} µs of the stub's thread "
                         f"({r['send_cpu_us']:.0f} µs CPU), {per_s:,.0f} sends/s over the instances; 256 streams at "
                         f"a token per {args.step_ms:g} ms need {need:,.0f}/s: a round of 256 sends takes "
                         f"{256 * r['send_us'] / r['instances'] / 1e3:.1f} ms of each stub against a "
                         f"{args.step_ms:g} ms step")
    print(markdown(rows))
    print("\n".join(notes))
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    if args.record:
        record.write(args.record, __file__, argv, args, machine("cpu"), rows, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
