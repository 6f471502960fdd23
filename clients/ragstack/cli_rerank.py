"""`ragstack rerank QUERY PASSAGE...`: the passages by reranker score, best first:
`score<TAB>index<TAB>passage`, index being the passage's position on the command line (from 0)."""
from __future__ import annotations

import argparse

from ragstack.cli_common import EXIT_OK, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("query")
    parser.add_argument("passages", nargs="+", metavar="PASSAGE", help="passages to score (1 to 64)")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        with connect(args) as client:
            ranked = client.rerank(args.query, args.passages)
        for item in ranked:
            print(f"{item.score:.4f}\t{item.index}\t{item.passage}")
        return EXIT_OK
    return run_reporting("rerank", body)
