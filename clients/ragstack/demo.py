"""`ragstack demo` (the README's first command): start the bundled Triton server on the CPU on free
ports, ask the `rag` ensemble one question over gRPC, print the answer as it streams and its
sources, stop the server."""
from __future__ import annotations

import argparse
import sys
import time

from ragstack.launcher import LauncherError, ServerOptions, TritonServer, free_ports

DEMO_LLM_NOTE = (
    "The demo LLM is a tiny random Qwen2 checkpoint (model_repository/llm/1/tiny-qwen2), so its answer is\n"
    "noise; retrieval, reranking and citations are real. To answer for real, point the llm at a local\n"
    "HF folder, e.g. Qwen2.5-0.5B-Instruct:  edit the `model` parameter in model_repository/llm/config.pbtxt\n"
    "(or write model_repository/llm/1/engine.json: {\"model\": \"/path/to/Qwen2.5-0.5B-Instruct\"}).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--query", default="How does paged attention store the KV cache?",
                        help="the question to send")
    parser.add_argument("--max-tokens", type=int, default=64, help="longest answer, in tokens")


def run(args: argparse.Namespace) -> int:
    from ragstack.client import RagClient
    from ragstack.results import RagstackError

    http, grpc, metrics = free_ports(3)
    options = ServerOptions(http_port=http, grpc_port=grpc, metrics_port=metrics)
    print("[demo] starting the bundled Triton server on the CPU (every model of model_repository/ and "
          "ensembles/) ...", flush=True)
    start = time.monotonic()
    try:
        with TritonServer(options) as server:
            print(f"[demo] ready in {time.monotonic() - start:.1f} s: gRPC {server.grpc_url}, "
                  f"HTTP {server.http_url}, metrics {server.metrics_url}\n")
            print(DEMO_LLM_NOTE + "\n")
            print(f"Q: {args.query}\nA: ", end="", flush=True)
            with RagClient(server.grpc_url, "grpc") as client:
                began = time.monotonic()
                stream = client.query(args.query, sampling_parameters={"temperature": 0.0},
                                      max_tokens=args.max_tokens)
                for delta in stream:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
                answer = stream.answer
                print(f"\n\n[demo] {answer.finish_reason or 'done'} after {time.monotonic() - began:.2f} s")
                print("Sources:")
                for s in answer.sources:
                    print(f"  [{s.n}] {s.source}  (passage {s.passage_id}, score {s.score:.3f})")
    except (LauncherError, RagstackError) as exc:
        print(f"\n[demo] error: {exc}", file=sys.stderr)
        return 1
    print("[demo] server stopped")
    return 0
