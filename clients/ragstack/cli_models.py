"""`ragstack models list|show|load|unload|reload [NAME] [--version N]`: the repository API.

list prints a line per model version: name, version, state and, for one that is not READY, the last
line of Triton's reason (the exception that failed its load); show NAME prints NAME's whole reasons,
tracebacks included."""
from __future__ import annotations

import argparse
import re
import sys

from ragstack.cli_common import EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting
from ragstack.results import RagstackError, last_meaningful_line

_LOAD_FAILED = re.compile(r"^load failed for model '[^']*': version \S+ is at \w+ state: ")  # Triton's words


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "show", "load", "unload", "reload"])
    parser.add_argument("name", nargs="?", help="the model (show, load, unload, reload)")
    parser.add_argument("--version", type=int,
                        help="load/reload: serve exactly this version (e.g. an older retriever index)")
    add_connection_arguments(parser)


def _list(models) -> None:
    shortened = False
    for model in models:
        short = model.short_reason
        shortened = shortened or short != model.reason.strip()
        reason = f"  ({short})" if short else ""
        print(f"{model.name:<20} {model.version or '-':<8} {model.state}{reason}")
    if shortened:
        print("ragstack models: a reason above is its last line; `ragstack models show NAME` prints it whole",
              file=sys.stderr)


def _show(models, name: str) -> None:
    found = [m for m in models if m.name == name]
    if not found:
        raise RagstackError(f"no model {name!r} in the server's repositories (`ragstack models list` names them)",
                            "NOT_FOUND")
    for model in found:
        print(f"{model.name}  version {model.version or '-'}  {model.state}")
        if model.reason:
            print(model.reason.rstrip())


def _load(client, name: str, version: int | None) -> None:
    """A failed load's reason can hold a traceback: its last line here, the whole of it in `show`."""
    try:
        client.load(name, version)
    except RagstackError as exc:
        if "\n" not in exc.message.strip():
            raise
        reason = _LOAD_FAILED.sub("", exc.message.strip())
        raise RagstackError(f"load failed for model {name!r}: {last_meaningful_line(reason)} "
                            f"(`ragstack models show {name}` prints the whole reason)", exc.code) from None


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        if args.action != "list" and not args.name:
            raise UsageError(f"models {args.action}: name the model")
        if args.version is not None and args.action not in ("load", "reload"):
            raise UsageError(f"models {args.action}: --version applies to load and reload only")
        with connect(args) as client:
            if args.action == "list":
                _list(sorted(client.models(), key=lambda m: (m.name, m.version)))
            elif args.action == "show":
                _show(sorted(client.models(), key=lambda m: m.version), args.name)
            elif args.action == "unload":
                client.unload(args.name)
                print(f"unloaded {args.name}")
            else:  # Triton reloads a loaded model whose files or config changed (a new version, a
                # pinned version dropped); an unchanged one stays as it is
                _load(client, args.name, args.version)
                which = f" version {args.version}" if args.version is not None else ""
                print(f"loaded {args.name}{which}")
        return EXIT_OK
    return run_reporting("models", body)
