"""`ragstack`: the project's one command line. Each subcommand lives in its own module."""
from __future__ import annotations

import argparse
import importlib
import os
import select
import sys

# The status of a Unix tool whose reader went away (`yes | head`: 128 + SIGPIPE).
EXIT_BROKEN_PIPE = 141


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

    # Client subcommands: each module has add_arguments(parser) and run(args) -> exit code.
    for name, module, help_text in [
        ("query", "cli_query", "ask the rag ensemble; prints the answer as it streams, then its sources"),
        ("embed", "cli_embed", "embed texts (JSON lines)"),
        ("rerank", "cli_rerank", "score passages against a query, best first"),
        ("models", "cli_models", "list, show, load, unload or reload models (repository API)"),
        ("index", "cli_index", "build or list retriever index versions"),
        ("bench", "cli_bench", "benchmark rag queries against a running server, with a per-step breakdown"),
        ("eval", "cli_eval", "retrieval quality (MRR, recall, nDCG) of retrieval, rerank and context"),
    ]:
        command = importlib.import_module(f"ragstack.{module}")
        p = sub.add_parser(name, help=help_text, description=command.__doc__)
        command.add_arguments(p)
        p.set_defaults(func=command.run)
    return parser


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (`ragstack ... | head` after head exited)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or stdout is not a file
        return False


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away shows up now
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():  # a pipe of something else (a socket, a child): not ours to hide
            raise
        # Quiet, as Unix tools are: nothing more goes to stdout, not even the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
