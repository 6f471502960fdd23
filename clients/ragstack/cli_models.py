"""`ragstack models list|load|unload|reload [NAME] [--version N]`: the repository API."""
from __future__ import annotations

import argparse

from ragstack.cli_common import EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "load", "unload", "reload"])
    parser.add_argument("name", nargs="?", help="the model (load, unload, reload)")
    parser.add_argument("--version", type=int,
                        help="load/reload: serve exactly this version (e.g. an older retriever index)")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        if args.action != "list" and not args.name:
            raise UsageError(f"models {args.action}: name the model")
        if args.version is not None and args.action not in ("load", "reload"):
            raise UsageError(f"models {args.action}: --version applies to load and reload only")
        with connect(args) as client:
            if args.action == "list":
                for model in sorted(client.models(), key=lambda m: (m.name, m.version)):
                    reason = f"  ({model.reason})" if model.reason else ""
                    print(f"{model.name:<20} {model.version or '-':<8} {model.state}{reason}")
            elif args.action == "unload":
                client.unload(args.name)
                print(f"unloaded {args.name}")
            else:  # Triton reloads a loaded model whose files or config changed (a new version, a
                # pinned version dropped); an unchanged one stays as it is
                client.load(args.name, args.version)
                which = f" version {args.version}" if args.version is not None else ""
                print(f"loaded {args.name}{which}")
        return EXIT_OK
    return run_reporting("models", body)
