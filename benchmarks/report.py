"""docs/benchmarks.md from the recorded runs (benchmarks/results/*.jsonl): for each benchmark how to run
it (its script's docstring) and one table of the latest run of each configuration, the same settings on
the same machine; each row names its run, and the runs are listed under the table with their date,
machine, commit, command and notes.

    python -m benchmarks.report            # write docs/benchmarks.md
    python -m benchmarks.report --check    # exit 1 when docs/benchmarks.md is not what it would write
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks import record
from benchmarks.table import markdown

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Benchmark:
    name: str  # its results file: results/<name>.jsonl
    script: str
    title: str
    transpose: bool = False  # a few rows of many measures: a column per row


BENCHMARKS = (  # in the page's order
    Benchmark("engine", "bench_engine", "Engine in-process vs HF generate()"),
    Benchmark("kernels", "bench_kernels", "Kernels alone, against the limits measured in the run"),
    Benchmark("serving", "bench_serving", "LLM through Triton vs in-process, and HF generate() through Triton"),
    Benchmark("send", "bench_send", "Decoupled response sends of one Python-backend stub (no engine)"),
    Benchmark("step_host", "bench_step_host", "Host time per engine step, async scheduling off / on"),
    Benchmark("reload", "bench_reload", "LLM unload / load cycles"),
    Benchmark("embed", "bench_embed", "Embedding through Triton vs in-process"),
    Benchmark("gateway", "bench_gateway", "HTTP through the gateway vs Triton directly"),
    Benchmark("grammar", "bench_grammar", "Grammar engines for structured output: xgrammar vs llguidance"),
    Benchmark("rag", "bench_rag", "RAG query", transpose=True),
    Benchmark("rag_gpu", "bench_rag_gpu", "RAG pipeline on the GPU: rag against the llm alone, same prompts",
              transpose=True),
    Benchmark("retrieval", "bench_retrieval", "Retrieval quality: dense, hybrid, rerank and the final context"),
    Benchmark("load", "load_test", "Load and overload", transpose=True),
)


def docstring(module: str) -> str:
    """A module's docstring, read without importing it (no torch for a page of text)."""
    return ast.get_docstring(ast.parse((HERE / f"{module}.py").read_text())) or ""


def current(runs: list[dict]) -> list[dict]:
    """The latest run of each configuration (machine and settings), newest first; of two in the same
    minute, the later line of the file is the later run."""
    order = sorted(range(len(runs)), key=lambda i: (runs[i]["date"], i))
    latest = {(runs[i]["machine"], json.dumps(runs[i]["settings"], sort_keys=True)): i for i in order}
    return [runs[i] for i in sorted(latest.values(), key=order.index, reverse=True)]


def numbered(row: dict, run: int, transpose: bool) -> dict:
    """The row with its run's number: the first column, or transposed the line under the heading."""
    items = list(row.items())
    at = 1 if transpose else 0
    return dict([*items[:at], ("run", run), *items[at:]])


def section(benchmark: Benchmark, runs: list[dict]) -> str:
    text = [f"## {benchmark.title}", "", f"`benchmarks/{benchmark.script}.py`", "", docstring(benchmark.script), ""]
    if not runs:
        return "\n".join(text + ["No run recorded yet."])
    rows = [numbered(row, i, benchmark.transpose) for i, run in enumerate(runs, 1) for row in run["rows"]]
    text += [markdown(rows, benchmark.transpose), "", "Runs:"]
    for i, run in enumerate(runs, 1):
        text.append(f"{i}. {run['date']}, {run['machine']} (host {run['host']}), commit {run['commit']}: "
                    f"`{run['command']}`")
        text += [f"   - {note}" for note in run["notes"]]
    return "\n".join(text)


def render(results: Path = record.RESULTS) -> str:
    known = {b.name for b in BENCHMARKS}
    unknown = sorted(p.stem for p in results.glob("*.jsonl") if p.stem not in known)
    if unknown:
        raise SystemExit(f"results of unknown benchmarks {unknown}: add them to benchmarks/report.py's BENCHMARKS")
    sections = []
    for benchmark in BENCHMARKS:
        path = results / f"{benchmark.name}.jsonl"
        sections.append(section(benchmark, current(record.read(path)) if path.exists() else []))
    head = ["# Benchmarks", "",
            "<!-- Written by `python -m benchmarks.report` from benchmarks/results/*.jsonl; edit those, not this. -->",
            "", "Today's figures. What was tried and what the figures meant, as it happened: "
            "[benchmarks-journal.md](benchmarks-journal.md).", "", docstring("__init__")]
    return "\n\n".join(["\n".join(head), *sections]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help=f"compare with {DOCS.name} instead of writing it")
    parser.add_argument("--results", type=Path, default=record.RESULTS, help="the folder of the .jsonl records")
    parser.add_argument("--out", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    text = render(args.results)
    if not args.check:
        args.out.write_text(text)
        return 0
    if args.out.exists() and args.out.read_text() == text:
        return 0
    print(f"{args.out} is not what the records give: run python -m benchmarks.report", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
