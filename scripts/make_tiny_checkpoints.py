"""Write the tiny random HF checkpoints (tiny-llama, tiny-mistral, tiny-qwen2) of ragstack.tiny_checkpoints.

`ragstack build` runs this in-process; by hand:

    python scripts/make_tiny_checkpoints.py [--out-dir checkpoints] [--only tiny-llama,tiny-qwen2] [--force]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragstack.tiny_checkpoints import CHECKPOINTS, build

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "checkpoints")
    parser.add_argument("--only", default=",".join(CHECKPOINTS),
                        help=f"comma-separated subset of {', '.join(CHECKPOINTS)}")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKPOINTS]
    if unknown:
        parser.error(f"unknown checkpoint(s) {unknown}; choose from {', '.join(CHECKPOINTS)}")
    build(args.out_dir, names, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
