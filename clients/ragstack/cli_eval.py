"""`ragstack eval [QUERIES] [--set python_reference]`: retrieval quality of the served pipeline.

QUERIES is a JSON-lines file of {"id", "query", "relevant": [document paths as the index names them]};
--set names one of the repository's evaluation sets instead (data/eval/<set>/queries.jsonl, its labels
expanded to the documents that contain a labeled one). The index being served must hold that corpus:
`ragstack index build` it first (`python -m ragstack.eval_sets python_reference FOLDER` writes the set's
corpus). Prints MRR@10, recall@1/5/10 and nDCG@10 of retrieval (dense and hybrid), rerank and the final
context, and whether every context is in the reranked order; --answers also asks `rag` each query.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ragstack.cli_common import EXIT_ERROR, EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queries", type=Path, nargs="?", help="labeled queries (JSON lines)")
    parser.add_argument("--set", dest="eval_set", help="an evaluation set of the repository: python_reference")
    parser.add_argument("--top-k", type=int, default=10, help="passages retrieved and reranked (default 10)")
    parser.add_argument("--context-top-k", type=int, help="rag_context's top_k (default: the server's)")
    parser.add_argument("--top-n", type=int, help="rag_context's top_n (default: the server's)")
    parser.add_argument("--modes", default="dense,hybrid", help="retrieval modes to measure (default dense,hybrid)")
    parser.add_argument("--version", default="", help="the retriever version for the retrieval stage")
    parser.add_argument("--answers", action="store_true", help="also ask rag each query at its defaults")
    parser.add_argument("--json", type=Path, help="write the figures as JSON to this file")
    add_connection_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from ragstack import eval_sets, evaluate  # noqa: PLC0415
    from benchmarks.table import markdown  # noqa: PLC0415

    if (args.queries is None) == (args.eval_set is None):
        raise UsageError("give a query file or --set NAME, one of them")
    try:
        if args.eval_set:
            queries = eval_sets.read_queries(eval_sets.queries_path(args.eval_set), eval_sets.corpus_texts(args.eval_set))
        else:
            queries = eval_sets.read_queries(args.queries)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    modes = tuple(m for m in args.modes.split(",") if m)
    with connect(args) as client:
        result = evaluate.evaluate(client, queries, args.top_k, modes, args.context_top_k, args.top_n,
                                   args.answers, args.version)
    print(markdown(result.table()))
    print(f"\n{result.queries} queries; context: {result.context_passages:.1f} passages on average, in the reranked "
          f"order for {result.context_in_reranked_order} of {result.queries}")
    if result.answers_ok is not None:
        print(f"rag answers at the defaults: {result.answers_ok} of {result.queries}")
        for error in result.answer_errors[:10]:
            print(f"  {error}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({**result.__dict__}, indent=2) + "\n")
    ok = result.context_in_reranked_order == result.queries and not result.answer_errors
    return EXIT_OK if ok else EXIT_ERROR


def run(args: argparse.Namespace) -> int:
    return run_reporting("eval", lambda: _run(args))
