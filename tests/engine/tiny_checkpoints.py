"""Session fixture: the tiny random checkpoints of ragstack.tiny_checkpoints.

Reuses checkpoints/ when `ragstack build` left it up to date, else builds them once into a temp dir.
Import the fixture into a test module: `from tiny_checkpoints import tiny_checkpoints  # noqa: F401`.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ragstack.tiny_checkpoints import ALL_CHECKPOINTS, build, is_up_to_date

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{"tiny-llama": folder, "tiny-mistral": folder, "tiny-qwen2": folder, "tiny-llama-fp8": folder}."""
    names = list(ALL_CHECKPOINTS)
    built = ROOT / "checkpoints"
    if all(is_up_to_date(built / n) for n in names):
        return {n: built / n for n in names}
    out = tmp_path_factory.mktemp("checkpoints")
    return dict(zip(names, build(out, names)))
