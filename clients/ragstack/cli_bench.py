"""`ragstack bench`: RAG queries against a running server at each concurrency; prints latency, TTFT,
queries/s and the per-step breakdown from the server's metrics. A recorded run of the same is
`python -m benchmarks.bench_rag --url ...` (benchmarks/ writes the records)."""
from __future__ import annotations

import argparse
import sys

from ragstack.cli_common import (EXIT_ERROR, EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting,
                                tls_arguments)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ragstack.rag_bench import DEFAULT_METRICS_URL  # noqa: PLC0415

    parser.add_argument("--concurrency", default="1,8", help="comma-separated levels (default 1,8)")
    parser.add_argument("--requests", type=int, default=32, help="queries per level")
    parser.add_argument("--max-tokens", type=int, default=64, help="answer length (greedy, EOS ignored)")
    parser.add_argument("--metrics-url", default=DEFAULT_METRICS_URL)
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        from ragstack import rag_bench  # noqa: PLC0415
        from ragstack.client import default_url  # noqa: PLC0415

        try:
            levels = [int(c) for c in args.concurrency.split(",")]
        except ValueError:
            raise UsageError(f"--concurrency {args.concurrency!r}: use numbers like 1,8") from None
        if min(levels) < 1 or args.requests < 1:
            raise UsageError("--concurrency and --requests must be at least 1")
        connect(args).close()  # the connection options checked (a usage error) before any query
        rows = rag_bench.bench(args.url or default_url(args.protocol), args.protocol, levels, args.requests,
                               args.max_tokens, args.metrics_url, tls=tls_arguments(args))
        print(rag_bench.table(rows))
        failed = [r for r in rows if r["ok"] < r["requests"]]
        for r in failed:
            print(f"ragstack bench: concurrency {r['concurrency']}: {r['requests'] - r['ok']} failed, "
                  f"e.g. {r['errors'][0]}", file=sys.stderr)
        return EXIT_ERROR if failed else EXIT_OK
    return run_reporting("bench", body)
