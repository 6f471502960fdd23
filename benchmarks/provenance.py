"""Which code and which machine a benchmark measured: the commit and machine its results are recorded with.

RAGSTACK_COMMIT wins when set: a copy of the tree on another machine (the GPU host) may carry no
.git, or a stale one. Otherwise the checkout's short commit, marked when the tree has changes.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def machine(device: str = "auto") -> str:
    """The GPU's name when the run used one ("auto": when torch sees one), else the CPU's
    architecture and core count."""
    if device != "cpu":
        import torch  # noqa: PLC0415  (only here: the CPU-only benchmarks need no torch)

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
