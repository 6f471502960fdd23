"""What the HTTP gateway (ragstack.gateway) adds to a request: the same requests through it and to
Triton's own HTTP port behind it, alternating one by one on one server, each over its own keep-alive
connection. Three requests: a health call, an `embed` infer of one text, and an llm generate_stream's
first byte (time to the first SSE event). Also what the gateway's JSON depth check costs on the
largest bodies it lets through (4 MiB), in this process.

    python -m benchmarks.bench_gateway [--requests 200] [--no-record]

Starts its own server (ragstack.launcher) with `embed` and `llm` loaded.
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import time

import numpy as np

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown

REQUESTS = {  # name -> (method, path, body, fraction of --requests: the llm's take longest)
    "health (GET /v2/health/ready)": ("GET", "/v2/health/ready", None, 1.0),
    "embed infer, 1 text": ("POST", "/v2/models/embed/infer", {"inputs": [
        {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["How does paged attention store the KV cache?"]}]},
        1.0),
    "llm generate_stream, first byte": ("POST", "/v2/models/llm/generate_stream", {
        "text_input": "Hello", "stream": True, "parameters": {"max_tokens": 16, "temperature": 0}}, 0.25),
}


def first_byte_s(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None) -> float:
    """Seconds from sending the request to the first byte of its body; the rest is read after."""
    start = time.perf_counter()
    connection.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    response = connection.getresponse()
    if response.length != 0:
        response.read(1)
    elapsed = time.perf_counter() - start
    response.read()
    assert response.status == 200, (path, response.status)
    return elapsed


def measure(urls: dict[str, str], requests: int) -> list[dict]:
    rows = []
    connections = {via: http.client.HTTPConnection(*url.rsplit(":", 1), timeout=60) for via, url in urls.items()}
    for name, (method, path, body, share) in REQUESTS.items():
        data = json.dumps(body).encode() if body is not None else None
        times = {via: [] for via in urls}
        for _ in range(3):  # warm up both paths
            for via, connection in connections.items():
                first_byte_s(connection, method, path, data)
        for _ in range(max(10, int(requests * share))):
            for via, connection in connections.items():
                times[via].append(first_byte_s(connection, method, path, data))
        for via, seconds in times.items():
            ms = np.array(seconds) * 1e3
            rows.append({"request": name, "path": via, "n": len(ms), "p50 ms": round(float(np.percentile(ms, 50)), 2),
                         "p99 ms": round(float(np.percentile(ms, 99)), 2)})
    return rows


def depth_scan_rows() -> list[dict]:
    from ragstack.gateway import json_depth

    bodies = {
        "4 MiB JSON of floats": json.dumps({"data": [0.123456] * 420_000}).encode(),
        "4 MiB JSON of short strings": json.dumps({"data": ["ab"] * 700_000}).encode(),
        "4 MiB prompt, escaped": json.dumps({"text_input": "\u4e2d\"" * 520_000}).encode(),
    }
    rows = []
    for name, body in bodies.items():
        seconds = []
        for _ in range(20):
            start = time.perf_counter()
            json_depth.depth(body)
            seconds.append(time.perf_counter() - start)
        ms = np.array(seconds) * 1e3
        rows.append({"request": f"depth check, {name} ({len(body) / (1 << 20):.1f} MiB)", "path": "in process",
                     "n": len(ms), "p50 ms": round(float(np.percentile(ms, 50)), 2),
                     "p99 ms": round(float(np.percentile(ms, 99)), 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind on each path")
    record.add_argument(parser, "gateway")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    from ragstack.launcher import ServerOptions, TritonServer, free_port

    options = ServerOptions(models=["embed", "embed_tokenizer", "embedder", "llm"], http_port=free_port(),
                            grpc_port=free_port(), metrics_port=free_port())
    with TritonServer(options) as server:
        rows = measure({"through the gateway": server.http_url, "Triton directly": server.triton_http_url},
                       args.requests)
    rows += depth_scan_rows()
    print(markdown(rows))
    if args.record:
        record.write(args.record, __file__, argv, args, machine("cpu"), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
