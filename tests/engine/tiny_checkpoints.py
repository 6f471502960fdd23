"""Session fixture: the tiny random checkpoints of scripts/make_tiny_checkpoints.py.

Reuses checkpoints/ when `ragstack build` left it up to date, else builds them once into a temp dir.
Import the fixture into a test module: `from tiny_checkpoints import tiny_checkpoints  # noqa: F401`.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_tiny_checkpoints.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_tiny_checkpoints", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{"tiny-llama": folder, "tiny-mistral": folder, "tiny-qwen2": folder}."""
    script = _script()
    names = list(script.CHECKPOINTS)
    built = ROOT / "checkpoints"
    if all(script.is_up_to_date(built / n) for n in names):
        return {n: built / n for n in names}
    out = tmp_path_factory.mktemp("checkpoints")
    return dict(zip(names, script.build(out, names)))
