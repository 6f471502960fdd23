"""CPU per streamed chunk of the OpenAI frontend's path, and of the official `openai` client, on the CPU:
a micro-benchmark of the per-chunk path alone (issue #22), not a serving benchmark (bench_serving.py
--api openai is that, on a GPU).

- `frontend`: the real frontend (`python -m ragstack.openai_frontend`, --openai-workers N) in front of a
  stand-in gRPC endpoint of this script's (`--fake-triton`, model `llm`: each streamed request answered
  with max_tokens pre-serialized responses of one 4-character token, one every --interval s, as an
  engine step would), read by a lean client (sse_client.py); it reports the frontend's CPU seconds
  (/proc/PID/stat, its workers included) per chunk received, chunks/s, TTFT and ITL.
- `client`: the `openai` SDK's AsyncOpenAI (as applications stream) and the lean client reading a
  canned SSE stream (`--canned`: the frontend's chunks, written as fast as they are read): the client's
  own CPU per chunk, and the most chunks/s one client process reads.

    python -m benchmarks.bench_openai_frontend --concurrency 16,64,128 --frontend-cpus 0 --client-cpus 1
    python -m benchmarks.bench_openai_frontend --what client --concurrency 1,16,64
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np

from benchmarks.sse_client import SSEConnection

TICK = os.sysconf("SC_CLK_TCK")
CANNED = json.dumps({"id": "cmpl-0123456789abcdef0123456789abcdef", "object": "text_completion", "created": 1,
                     "model": "llm", "choices": [{"index": 0, "text": " tok", "logprobs": None,
                                                  "finish_reason": None}], "usage": None})


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and of its children (a supervisor's workers)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# --- the stand-in sources -------------------------------------------------------------------------

def fake_triton(port: int, interval: float) -> None:
    import grpc
    import tritonclient.grpc.model_config_pb2 as mc
    import tritonclient.grpc.service_pb2 as pb

    def response(text: str, final: bool, reason: str | None) -> bytes:
        r = pb.ModelInferResponse(model_name="llm", model_version="1")
        for name, dtype, raw in (("text_output", "BYTES", struct.pack("<I", len(text)) + text.encode()),
                                 *((("finish_reason", "BYTES", struct.pack("<I", len(reason)) + reason.encode()),)
                                   if reason else ()),
                                 ("num_input_tokens", "UINT32", struct.pack("<I", 100)),
                                 ("num_output_tokens", "UINT32", struct.pack("<I", 1))):
            r.outputs.add(name=name, datatype=dtype, shape=[1])
            r.raw_output_contents.append(raw)
        r.parameters["triton_final_response"].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=r).SerializeToString()

    token, last = response(" tok", False, None), response(" end", True, "length")
    config = mc.ModelConfig(name="llm", backend="triton_llm")
    for name in ("text_input", "messages", "stream", "sampling_parameters"):
        config.input.add(name=name, data_type=mc.TYPE_STRING, dims=[1])
    for name in ("text_output", "finish_reason"):
        config.output.add(name=name, data_type=mc.TYPE_STRING, dims=[-1])
    config_bytes = pb.ModelConfigResponse(config=config).SerializeToString()

    async def stream_infer(requests, _context):
        async for raw in requests:
            request = pb.ModelInferRequest.FromString(raw)
            names = [t.name for t in request.inputs]
            sampling = json.loads(request.raw_input_contents[names.index("sampling_parameters")][4:])
            for _ in range(int(sampling.get("max_tokens", 16)) - 1):
                await asyncio.sleep(interval)
                yield token
            await asyncio.sleep(interval)
            yield last
            return

    def unary(answer: bytes):
        async def handler(_raw, _context):
            return answer
        return handler

    async def main():
        def same(b: bytes) -> bytes:   # pre-serialized both ways
            return b

        handlers = {"ModelStreamInfer": grpc.stream_stream_rpc_method_handler(stream_infer, same, same),
                    "ModelConfig": grpc.unary_unary_rpc_method_handler(unary(config_bytes), same, same),
                    "ServerReady": grpc.unary_unary_rpc_method_handler(
                        unary(pb.ServerReadyResponse(ready=True).SerializeToString()), same, same)}
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("inference.GRPCInferenceService",
                                                                              handlers)])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def canned_sse(port: int) -> None:
    from aiohttp import web
    chunk = f"data: {CANNED}\n\n".encode()

    async def completions(request):
        body = await request.json()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(body.get("max_tokens", 16)):
            await response.write(chunk)
        usage = {"id": "cmpl-0", "object": "text_completion", "created": 1, "model": "llm", "choices": [],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


# --- the clients ----------------------------------------------------------------------------------

async def run_openai(url: str, n: int, c: int, max_tokens: int) -> list[tuple[float, list[float], int]]:
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
    sem = asyncio.Semaphore(c)

    async def one():
        async with sem:
            start, times = time.perf_counter(), []
            stream = await client.completions.create(model="llm", prompt="hi", max_tokens=max_tokens, stream=True,
                                                     stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.choices:
                    times.append(time.perf_counter())
            return times[0] - start, list(np.diff(times)), len(times)
    try:
        return await asyncio.gather(*(one() for _ in range(n)))
    finally:
        await client.close()


async def run_lean(url: str, n: int, c: int, max_tokens: int) -> list[tuple[float, list[float], int]]:
    """Reads the events off the socket (sse_client.py, as bench_serving does), no more: what the server
    costs, not the client."""
    address = urllib.parse.urlsplit(url)
    body = json.dumps({"model": "llm", "prompt": "hi", "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    sem, pool = asyncio.Semaphore(c), []

    async def one():
        async with sem:
            connection = pool.pop() if pool else SSEConnection(address.hostname, address.port)
            start, times = time.perf_counter(), []
            async for data in connection.events("/v1/completions", body):
                if b'"text"' in data:
                    times.append(time.perf_counter())
            pool.append(connection)
            return times[0] - start, list(np.diff(times)), len(times)
    try:
        return await asyncio.gather(*(one() for _ in range(n)))
    finally:
        for connection in pool:
            await connection.close()


def measure(label: str, client, url: str, n: int, c: int, max_tokens: int, server_pid: int | None) -> dict:
    asyncio.run(client(url, min(4, n), min(4, c), 8))   # connections and the model's config
    server0 = cpu_s(server_pid) if server_pid else 0.0
    mine0, t0 = time.process_time(), time.perf_counter()
    results = asyncio.run(client(url, n, c, max_tokens))
    wall, mine = time.perf_counter() - t0, time.process_time() - mine0
    chunks = sum(r[2] for r in results)
    gaps = [g for r in results for g in r[1]]
    row = {"run": label, "concurrency": c, "requests": n, "chunks": chunks, "chunks/s": round(chunks / wall),
           "TTFT p50 ms": round(float(np.percentile([r[0] for r in results], 50)) * 1e3, 1),
           "ITL p50 ms": round(float(np.percentile(gaps, 50)) * 1e3, 2),
           "ITL p99 ms": round(float(np.percentile(gaps, 99)) * 1e3, 1),
           "client CPU us/chunk": round(mine / chunks * 1e6)}
    if server_pid:
        row["frontend CPU us/chunk"] = round((cpu_s(server_pid) - server0) / chunks * 1e6)
    print(json.dumps(row), flush=True)
    return row


def _start(args: list[str], cpus: str | None, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*(["taskset", "-c", cpus] if cpus else []), sys.executable, *args], env=env)


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer in {timeout:.0f} s")
            time.sleep(0.3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", choices=["frontend", "client", "both"], default="both")
    parser.add_argument("--concurrency", default="16,64,128")
    parser.add_argument("--requests-per-stream", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--interval", type=float, default=0.004, help="seconds between a stream's tokens")
    parser.add_argument("--openai-workers", type=int, default=1)
    parser.add_argument("--frontend-cpus", help="taskset list for the frontend (or the canned source), e.g. 0")
    parser.add_argument("--client-cpus", help="taskset list for the stand-in Triton and this client, e.g. 1")
    parser.add_argument("--fake-triton", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--canned", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.fake_triton:
        fake_triton(args.fake_triton, args.interval)
        return 0
    if args.canned:
        canned_sse(args.canned)
        return 0
    from ragstack.launcher import free_port

    if args.client_cpus:
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    levels = [int(c) for c in args.concurrency.split(",")]
    rows, procs = [], []
    try:
        if args.what in ("frontend", "both"):
            grpc_port, http_port = free_port(), free_port()
            procs.append(_start(["-m", "benchmarks.bench_openai_frontend", "--fake-triton", str(grpc_port),
                                 "--interval", str(args.interval)], args.client_cpus))
            frontend = _start(["-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{http_port}", "--triton",
                               f"127.0.0.1:{grpc_port}",
                               "--openai-workers", str(args.openai_workers)],
                              args.frontend_cpus)
            procs.append(frontend)
            _wait_http(f"http://127.0.0.1:{http_port}/health")
            for c in levels:
                rows.append(measure(f"frontend x{args.openai_workers}, lean client", run_lean,
                                    f"http://127.0.0.1:{http_port}", c * args.requests_per_stream, c,
                                    args.max_tokens, frontend.pid))
        if args.what in ("client", "both"):
            port = free_port()
            procs.append(_start(["-m", "benchmarks.bench_openai_frontend", "--canned", str(port)],
                                args.frontend_cpus))
            time.sleep(2)
            for name, client in (("canned SSE, openai client", run_openai), ("canned SSE, lean client", run_lean)):
                for c in levels:
                    rows.append(measure(name, client, f"http://127.0.0.1:{port}", c * args.requests_per_stream, c,
                                        args.max_tokens, None))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    from benchmarks.table import markdown
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
