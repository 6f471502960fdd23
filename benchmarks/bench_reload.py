"""Unload and load the llm repeatedly through the repository API and watch GPU memory: after each
unload the engine's memory must be given back, and each load must end where the first one did.

The server runs --model as bench_serving.py writes it; memory is the device's used memory
(nvidia-smi), so it also sees the Python backend stub that holds the engine.

    python -m benchmarks.bench_reload --model /tmp/llama3-8b --cycles 3
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import record
from benchmarks.bench_serving import write_repository  # the same llm model as the serving benchmark
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[0])


def generate_once(client) -> str:
    import numpy as np
    import tritonclient.grpc as grpcclient

    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello"], dtype=np.object_))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    params.set_data_from_numpy(np.array([json.dumps({"max_tokens": 8, "temperature": 0}).encode()],
                                        dtype=np.object_))
    results = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    client.async_stream_infer("llm", [text, params])
    while not results:
        time.sleep(0.05)
    client.stop_stream()
    if isinstance(results[0], Exception):
        raise RuntimeError(f"generate after reload failed: {results[0]}")
    return results[0].as_numpy("text_output")[0].decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--engine", default="{}", help="JSON of EngineConfig settings")
    parser.add_argument("--tolerance-mib", type=int, default=512, help="allowed growth over the first load")
    record.add_argument(parser, "reload")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    import tritonclient.grpc as grpcclient
    from ragstack.launcher import ServerOptions, TritonServer, free_port

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_repository(Path(tmp), args.model, json.loads(args.engine))
        options = ServerOptions(model_repositories=[Path(tmp)], models=["llm"], http_port=free_port(),
                                grpc_port=free_port(), metrics_port=free_port(), startup_timeout_s=900)
        with TritonServer(options) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            rows.append(step("load 0", None, client))
            for cycle in range(1, args.cycles + 1):
                client.unload_model("llm")
                while client.is_model_ready("llm"):
                    time.sleep(0.2)
                time.sleep(2)  # the stub process exits after the model reports unloaded
                rows.append(step(f"unload {cycle}", None))
                start = time.perf_counter()
                client.load_model("llm")
                rows.append(step(f"load {cycle}", time.perf_counter() - start, client))
    first = rows[0]["GPU memory used MiB"]
    growth = max(r["GPU memory used MiB"] for r in rows if r["step"].startswith("load")) - first
    ok = growth <= args.tolerance_mib
    notes = [f"growth over the first load: {growth} MiB ({'within' if ok else 'over'} {args.tolerance_mib} MiB)"]
    print(markdown(rows))
    print(notes[0])
    if args.record:
        record.write(args.record, __file__, argv, args, machine(), rows, notes)
    return 0 if ok else 1


def step(name: str, load_s: float | None, client=None) -> dict:
    """A row: the device's memory after `name`, then (with a client) what the llm generates."""
    used = gpu_used_mib()
    return {"step": name, "load s": rounded(load_s, 1), "GPU memory used MiB": used,
            "generated": generate_once(client)[:30] if client else ""}


if __name__ == "__main__":
    raise SystemExit(main())
