"""`ragstack`: the project's one command line. Each subcommand lives in its own module."""
from __future__ import annotations

import argparse
import sys


def _build(args: argparse.Namespace) -> int:
    from ragstack import build
    return build.run(force=args.force, only=args.only)


def _serve(args: argparse.Namespace) -> int:
    from ragstack import serve
    return serve.run(args)


def _demo(args: argparse.Namespace) -> int:
    from ragstack import demo
    return demo.run(args)


def make_parser() -> argparse.ArgumentParser:
    from ragstack import demo, serve
    parser = argparse.ArgumentParser(prog="ragstack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build the artifacts (ONNX models, checkpoints, indexes); skips what is up to date")
    p.add_argument("--force", action="store_true", help="rebuild everything")
    p.add_argument("--only", action="append", help="build only this step (repeatable)")
    p.set_defaults(func=_build)

    p = sub.add_parser("serve", help="run the real Triton server on the project's repositories")
    serve.add_arguments(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("demo", help="start the server, answer one query over gRPC, stop")
    demo.add_arguments(p)
    p.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
