"""benchmarks/kernel_report.py: the attention kernels compiled for sm_90 on this CPU (no GPU), with the
launch parameters the engine would use there."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes or compiles kernels: not in `make test-fast`

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_report.py"


def report(*args: str) -> subprocess.CompletedProcess:
    # This suite runs kernels in the interpreter (tests/engine/conftest.py); the report compiles them.
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_fp8_decode_compiles_under_a_register_cap():
    result = report("--kernel", "decode", "--kv-dtype", "fp8",
                    "--launch", '{"num_warps": 4, "BLOCK_N": 128, "maxnreg": 128}')
    assert result.returncode == 0, result.stderr
    assert '"maxnreg": 128' in result.stdout and '"IS_FP8": true' in result.stdout
    # Without the cap reaching ptxas, this tile takes 168 registers (Triton 3.6) or more.
    assert int(re.search(r"registers (\d+)", result.stdout)[1]) <= 128
    assert re.search(r"loop 1: \d+ instructions; .*HMMA", result.stdout)


def test_prefill_report_takes_launch_overrides(tmp_path):
    sass = tmp_path / "prefill.sass"
    result = report("--kernel", "prefill", "--launch", '{"BLOCK_M": 64, "num_warps": 4}', "--sass", str(sass))
    assert result.returncode == 0, result.stderr
    assert '"num_warps": 4' in result.stdout and '"BLOCK_M": 64' in result.stdout
    assert "HGMMA" in sass.read_text()  # Hopper's warpgroup MMA for the 64-row tiles


def test_unknown_family_and_interpreter_are_refused():
    assert report("--family", "a100").returncode == 2
    env_run = subprocess.run([sys.executable, str(SCRIPT)], env={**os.environ, "TRITON_INTERPRET": "1"},
                             capture_output=True, text=True, timeout=60)
    assert env_run.returncode == 1 and "unset TRITON_INTERPRET" in env_run.stderr


def test_skinny_down_projection_reads_the_activation_without_recomputing_it():
    """gate_up's swiglu output leaves the down projection's loop without the SwiGLU gate's arithmetic."""
    per_weight, mix = {}, {}
    for projection in ("down", "down, gated"):
        result = report("--kernel", "skinny", "--weights", "fp8", "--projection", projection)
        assert result.returncode == 0, result.stderr
        assert '"W_FP8": true' in result.stdout and '"USE_DOT": false' in result.stdout
        loop = re.search(r"loop 1: \d+ instructions \(([\d.]+) per weight\); (.*)", result.stdout)
        per_weight[projection] = float(loop[1])
        mix[projection] = dict((op, int(n)) for op, n in re.findall(r"(\S+) (\d+)", loop[2]))
    assert per_weight["down"] < 0.8 * per_weight["down, gated"]
    assert mix["down"].get("FMUL", 0) < mix["down, gated"]["FMUL"] / 4  # silu(gate) * up per weight tile


def test_skinny_fp8_weights_load_in_x_layout_without_a_shared_memory_round_trip():
    """h200.json's weight_vector 8: the e4m3 tiles come 8 to a thread like x's bf16 columns; left to the
    compiler (0) they come 16 to a thread and each tile (4 x 1024 e4m3) is rearranged through 4 KB of shared
    memory."""
    shared = {}
    for vector in (8, 0):
        result = report("--kernel", "skinny", "--weights", "fp8", "--projection", "o",
                        "--launch", f'{{"weight_vector": {vector}}}')
        assert result.returncode == 0, result.stderr
        shared[vector] = int(re.search(r"shared memory ([\d,]+) bytes", result.stdout)[1].replace(",", ""))
    assert shared[8] <= 1024 < 4096 <= shared[0]
