"""Write the tiny random HF checkpoints of ragstack.tiny_checkpoints (tiny-llama, tiny-mistral, tiny-qwen2, and
tiny-llama-fp8, an FP8 copy of tiny-llama).

`ragstack build` runs this in-process; by hand:

    python scripts/make_tiny_checkpoints.py [--out-dir checkpoints] [--only tiny-llama,tiny-qwen2] [--force]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragstack.tiny_checkpoints import ALL_CHECKPOINTS, build

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "checkpoints")
    parser.add_argument("--only", default=",".join(ALL_CHECKPOINTS),
                        help=f"comma-separated subset of {', '.join(ALL_CHECKPOINTS)}")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_CHECKPOINTS]
    if unknown:
        parser.error(f"unknown checkpoint(s) {unknown}; choose from {', '.join(ALL_CHECKPOINTS)}")
    build(args.out_dir, names, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
