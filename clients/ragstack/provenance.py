"""Which code a benchmark measured: the commit its results are recorded with.

RAGSTACK_COMMIT wins when set: a copy of the tree on another machine (the GPU host) may carry no
.git, or a stale one. Otherwise the checkout's short commit, marked when the tree has changes.
"""
from __future__ import annotations

import os
import subprocess
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
