#!/usr/bin/env python3
"""Build the default retriever index, version 1, from data/sample_corpus (ragstack.default_index).

`ragstack build` runs this in-process (step default-index); by hand: python scripts/build_default_index.py
"""
from __future__ import annotations

import sys

from ragstack import default_index
from ragstack.launcher import LauncherError


def main() -> int:
    try:
        default_index.build()
    except LauncherError as exc:
        print(f"[index] cannot start the server to embed with: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
