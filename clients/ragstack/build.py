"""`ragstack build`: produce every built artifact (ONNX models, tiny checkpoints, indexes).

Each step names its inputs and outputs; a step whose outputs are all newer than its inputs is
skipped, so re-running is fast. Steps run in order, in this process: each calls the ragstack module
that holds its logic (scripts/ has a command line for each, to run one by hand). None needs a process
of its own: the default index starts its Triton server as a child, through the launcher.
"""
from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ragstack import default_index, onnx_export, tiny_checkpoints

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Step:
    name: str
    run: partial                # called in this process; prints its own progress
    inputs: list[str]           # files or folders (relative to ROOT) whose change forces a rebuild
    outputs: list[str]          # files the step writes (relative to ROOT)


# Each build step of the project, in dependency order.
STEPS: list[Step] = []
STEPS.append(Step(
    name="onnx-models",  # embedder v1 fp32 + v2 int8, reranker v1, from the packaged all-MiniLM-L6-v2
    run=partial(onnx_export.export_defaults, ROOT / "model_repository"),
    inputs=["clients/ragstack/onnx_export.py", "clients/ragstack/onnx_graphs.py", "requirements.lock"],
    outputs=["model_repository/embedder/1/model.onnx", "model_repository/embedder/2/model.onnx",
             "model_repository/reranker/1/model.onnx"],
))
STEPS.append(Step(
    name="tiny-checkpoints",  # tiny random Llama / Mistral / Qwen2 HF folders for the engine tests
    run=partial(tiny_checkpoints.build, ROOT / "checkpoints", list(tiny_checkpoints.ALL_CHECKPOINTS)),
    inputs=["clients/ragstack/tiny_checkpoints.py", "llm_engine/model/fp8_checkpoint.py"],
    outputs=["checkpoints/tiny-llama/config.json", "checkpoints/tiny-mistral/config.json",
             "checkpoints/tiny-qwen2/config.json", "checkpoints/tiny-llama-fp8/config.json"],
))

STEPS.append(Step(
    name="llm-demo-checkpoint",  # the served llm's default weights: a tiny random Qwen2 (see docs/llm_model.md)
    run=partial(tiny_checkpoints.build, ROOT / "model_repository" / "llm" / "1", ["tiny-qwen2"]),
    inputs=["clients/ragstack/tiny_checkpoints.py"],
    outputs=["model_repository/llm/1/tiny-qwen2/config.json"],
))

STEPS.append(Step(
    name="default-index",  # retriever version 1 from data/sample_corpus, embedded by the served `embed` model
    run=partial(default_index.build),
    inputs=["data/sample_corpus", "clients/ragstack/default_index.py", "clients/ragstack/indexer.py",
            "clients/ragstack/chunking.py", "clients/ragstack/documents.py", "clients/ragstack/index_store.py",
            "model_repository/embedder/1/model.onnx"],
    outputs=["model_repository/retriever/1/manifest.json"],
))


def _mtime(path: Path) -> float:
    if path.is_dir():
        return max((p.stat().st_mtime for p in path.rglob("*") if p.is_file()), default=0.0)
    return path.stat().st_mtime


def is_up_to_date(step: Step) -> bool:
    outputs = [ROOT / o for o in step.outputs]
    if not all(o.exists() for o in outputs):
        return False
    newest_input = max((_mtime(ROOT / i) for i in step.inputs if (ROOT / i).exists()), default=0.0)
    return min(_mtime(o) for o in outputs) >= newest_input


def run(force: bool = False, only: list[str] | None = None) -> int:
    for step in STEPS:
        if only and step.name not in only:
            continue
        if not force and is_up_to_date(step):
            print(f"[build] {step.name}: up to date")
            continue
        print(f"[build] {step.name}: {step.run.func.__module__}.{step.run.func.__name__}", flush=True)
        try:
            step.run()
        except Exception:  # noqa: BLE001 - any failure of a step stops the build with its traceback and status 1
            traceback.print_exc()
            print(f"[build] {step.name} failed", file=sys.stderr)
            return 1
    return 0
