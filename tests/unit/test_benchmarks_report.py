"""docs/benchmarks.md is what benchmarks/report.py writes from the recorded runs, and a run recorded by
benchmarks/record.py comes out in the report: its rows, date, machine and commit, the latest run of a
configuration replacing an earlier one."""
from __future__ import annotations

import argparse

from benchmarks import record, report


def test_docs_benchmarks_md_is_regenerated_from_the_records():
    assert report.main(["--check"]) == 0, "run: python -m benchmarks.report"


def test_a_recorded_run_round_trips_into_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSTACK_COMMIT", "abc1234")
    path = tmp_path / "engine.jsonl"
    args = argparse.Namespace(model="/tmp/m", workloads="a", record=str(path), json=None)
    rows = [{"system": "engine", "workload": "a", "tok/s": 1234, "TTFT p50 ms": 12.5, "ITL p50 ms": float("nan")}]
    for tok_s in (1000, 1234):  # the same configuration twice: only the second is current
        rows[0]["tok/s"] = tok_s
        written = record.write(path, "benchmarks/bench_engine.py", ["--model", "/tmp/m"], args, "GPU X", rows,
                               ["a note"])
    other = record.write(path, "benchmarks/bench_engine.py", ["--workloads", "b"],
                         argparse.Namespace(model="/tmp/m", workloads="b"), "GPU X", [{"system": "hf", "tok/s": 7}])

    runs = record.read(path)
    assert runs[1] == written and runs[2] == other
    assert written["settings"] == {"model": "/tmp/m", "workloads": "a"}  # not where the output went
    assert written["rows"][0]["ITL p50 ms"] is None and written["commit"] == "abc1234"
    assert written["command"] == "python -m benchmarks.bench_engine --model /tmp/m"

    text = report.render(tmp_path)
    # Newest run first; columns in the order they first appear.
    assert "| run | system | tok/s | workload | TTFT p50 ms | ITL p50 ms |" in text
    assert "| 1 | hf | 7 | - | - | - |\n| 2 | engine | 1,234 | a | 12.5 | - |" in text
    assert "1,000" not in text
    assert f"2. {written['date']}, GPU X (host {written['host']}), commit abc1234: " \
           "`python -m benchmarks.bench_engine --model /tmp/m`\n   - a note" in text
