"""Summarize py-spy's collapsed stacks (`py-spy record --format raw --threads [--idle]`): per thread, its
share of the samples, then the functions holding most of them inclusively and at the leaf. Two files side by
side (e.g. gpu_serving.sh's engine behind Triton and in-process) answer where one spends the time the other
does not.

    python -m benchmarks.pyspy_summary engine_triton_256.txt engine_in_process_256.txt --top 25
"""
from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

# "name (path/to/file.py:123)" -> "name (file.py)": lines of one function are counted together.
FRAME = re.compile(r"^(?P<name>.*?) \((?P<path>[^():]*?)(?::\d+)?\)$")


def function_of(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['name']} ({Path(match['path']).name})"


def read(path: Path) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks per thread (the root frame py-spy's --threads adds), each stack root first."""
    threads: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        frames = frames[1:] if thread != "?" else frames
        threads[thread].append(([function_of(f) for f in frames], int(count)))
    return threads


def summarize(path: Path, top: int) -> None:
    threads = read(path)
    total = sum(n for stacks in threads.values() for _, n in stacks)
    print(f"== {path}: {total} samples")
    for thread, stacks in sorted(threads.items(), key=lambda kv: -sum(n for _, n in kv[1])):
        samples = sum(n for _, n in stacks)
        if samples < 0.02 * total:
            continue
        inclusive, leaf = collections.Counter(), collections.Counter()
        for frames, n in stacks:
            for name in set(frames):
                inclusive[name] += n
            leaf[frames[-1] if frames else "?"] += n
        print(f"-- {thread}: {samples} samples ({100 * samples / total:.1f}%)")
        print("   inclusive:")
        for name, n in inclusive.most_common(top):
            print(f"   {100 * n / samples:5.1f}%  {name}")
        print("   leaf:")
        for name, n in leaf.most_common(top // 2):
            print(f"   {100 * n / samples:5.1f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    for path in args.files:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
