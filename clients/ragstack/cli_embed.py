"""`ragstack embed TEXT...`: one JSON line per text, {"text", "embedding", "truncated"}."""
from __future__ import annotations

import argparse
import json

from ragstack.cli_common import EXIT_OK, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed (1 to 32)")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        with connect(args) as client:
            result = client.embed(args.texts)
        for text, vector, truncated in zip(args.texts, result.vectors, result.truncated):
            print(json.dumps({"text": text, "embedding": [round(float(v), 6) for v in vector],
                              "truncated": truncated}))
        return EXIT_OK
    return run_reporting("embed", body)
