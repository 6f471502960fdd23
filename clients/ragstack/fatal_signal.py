"""The line Triton logs for a signal it caught, `Signal (N) received.`, when N is a crash (SIGINT and
SIGTERM are stops, logged the same way), and a log's new such lines.

Triton 2.51 aborts now and then on glibc's heap check, and its crash handler can then hang: it prints a
backtrace, which mallocs, while the heap is locked. The process lives on and answers nothing
(docs/operations.md). The launcher and `ragstack.triton_watch` kill such a server; the tests replace it."""
from __future__ import annotations

import re
from pathlib import Path

FATAL_SIGNAL = re.compile(rb"^Signal \((?!2\)|15\))(\d+)\) received\.", re.MULTILINE)


def fatal_signal(line: bytes) -> int | None:
    """The signal number if `line` is Triton's line for a crash."""
    match = FATAL_SIGNAL.match(line)
    return int(match.group(1)) if match else None


class LogWatch:
    """The fatal-signal lines a log gains after `offset`, the point read last."""

    def __init__(self, log: Path, offset: int = 0) -> None:
        self.log = log
        self.offset = offset

    def new_fatal_lines(self) -> list[str]:
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                text = f.read()
        except FileNotFoundError:
            return []
        # a line cut at the end is read again next time
        end = text.rfind(b"\n") + 1
        self.offset += end
        return [m.group(0).decode() for m in FATAL_SIGNAL.finditer(text[:end])]
