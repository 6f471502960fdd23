"""Which code a benchmark measured: the commit its results are recorded with.

RAGSTACK_COMMIT wins when set: a copy of the tree on another machine (the GPU host) may carry no
.git, or a stale one. Otherwise the checkout's short commit, marked when the tree has changes.
"""
from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_commit() -> str:
    if os.environ.get("RAGSTACK_COMMIT"):
        return os.environ["RAGSTACK_COMMIT"]

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def append_record(path: str | Path, title: str, machine: str, script: str, argv: list[str], body: str,
                  details: str = "") -> None:
    """Append one result section to a markdown record: the title with the UTC time, then the machine,
    host, commit, `details` (e.g. "model X") and the command that produced `body`."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    extra = f"{details}; " if details else ""
    with open(path, "a") as f:
        f.write(f"\n## {title} ({stamp})\n\nMachine: {machine}, {platform.node()}; commit {source_commit()}; "
                f"{extra}command: `python scripts/{script} {' '.join(argv)}`\n\n{body}\n")
