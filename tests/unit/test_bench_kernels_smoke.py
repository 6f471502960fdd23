"""bench_kernels.py's reference checks run on the CPU (Triton interpreter, tiny shapes), so a change
to a kernel's contract that breaks the benchmark fails here, not on the GPU machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes or compiles kernels: not in `make test-fast`

ROOT = Path(__file__).resolve().parents[2]


def test_bench_kernels_smoke_passes_every_reference_check():
    result = subprocess.run([sys.executable, "-m", "benchmarks.bench_kernels", "--smoke"], cwd=ROOT,
                            env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " 0 failed" in result.stdout
