"""A benchmark run as one JSON record, one line of benchmarks/results/<benchmark>.jsonl.

    {"date": "2026-12-04 02:50 UTC", "machine": "NVIDIA H200", "host": "vm",
     "command": "python -m benchmarks.bench_engine --model /tmp/l8b ...", "commit": "38163fb",
     "settings": {...the run's options...}, "rows": [{column: value, ...}, ...], "notes": ["...", ...]}

`rows` are the rows of the run's table (the same dicts the script prints as markdown), values as
shown: numbers rounded by the script, None for a missing cell. `settings` are the options that
define the run (not where its output goes): with the machine, the configuration whose latest run
docs/benchmarks.md shows (benchmarks/report.py).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.provenance import source_commit

RESULTS = Path(__file__).resolve().parent / "results"
DATE_FORMAT = "%Y-%m-%d %H:%M UTC"  # sorts as text
# Options that say where a run's output goes, not what it measures.
OUTPUT_OPTIONS = {"json", "record", "no_record"}


def add_argument(parser: argparse.ArgumentParser, benchmark: str) -> None:
    """--record FILE, by default this benchmark's results file."""
    parser.add_argument("--record", default=str(RESULTS / f"{benchmark}.jsonl"),
                        help="append the run's JSON record to this file ('' to skip; default: %(default)s)")


def write(path: str | Path, script: str, argv: list[str], args: argparse.Namespace, machine: str,
          rows: list[dict], notes: list[str] = ()) -> dict:
    """Append the record of a run of `script` (the benchmark's __file__) with `argv`, parsed into
    `args`, finished now, to `path`; returns it."""
    settings = {key: value for key, value in vars(args).items() if key not in OUTPUT_OPTIONS}
    record = {"date": datetime.now(timezone.utc).strftime(DATE_FORMAT), "machine": machine, "host": platform.node(),
              "command": shlex.join(["python", "-m", f"benchmarks.{Path(script).stem}", *argv]),
              "commit": source_commit(), "settings": _plain(settings), "rows": _plain(rows), "notes": list(notes)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def read(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _plain(value):
    """JSON's own types: numpy scalars as numbers, NaN as None, tuples and paths as lists and text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # a numpy or torch scalar
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
