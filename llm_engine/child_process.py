"""A helper process of the engine, `python -m <module>`, and the child's side of the arrangement.

The parent writes the child's start message (pickled) to its stdin, which then stays open for the
parent's lifetime: the child watches it (`read_start_message`) and exits at end of file, so a
parent that dies, even by SIGKILL, leaves no child behind. The child's stderr is relayed line by
line, with a prefix, to the parent's stderr, and its last lines are kept for the error the parent
raises when the child fails. Used for the tensor-parallel workers (worker_group.py) and the
engine process (engine/process_client.py).

A child that may outlive its parent (an engine process shared by several clients, engine_share.py)
is started with `log_file`: its stderr goes to that file instead of a pipe (a pipe would break when
the parent exits), the parent relays the file's new lines while it lives, and any process can quote
the file's last lines; its start message says `outlive_parent`, so it does not watch its stdin.
"""
from __future__ import annotations

import collections
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO

TAIL_LINES = 40         # of a failed child's output, quoted in the error
LOG_POLL_S = 0.1        # how often a log file's new lines are relayed


class ChildProcess:
    def __init__(self, module: str, start: dict, label: str, pass_fds: tuple[int, ...] = (),
                 args: tuple[str, ...] = (), log_file: Path | None = None) -> None:
        """Start `python -m module *args` and send it `start`; its stderr lines go out as `[label] ...`
        (through `log_file` when given: see the module's docstring). `args` only label the process
        for `ps` and process_tree.py: the child reads its start message."""
        self.label = label
        self.log_file = log_file
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        if log_file is None:
            self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                         stderr=subprocess.PIPE, pass_fds=pass_fds)
            relay = (_relay, (self.proc.stderr, label, self.tail))
        else:
            with open(log_file, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                             stderr=log, pass_fds=pass_fds)
            relay = (_relay_file, (log_file, label, self.tail, self.proc))
        self._relay = threading.Thread(target=relay[0], args=relay[1],
                                       name=f"{label}-stderr".replace(" ", "-"), daemon=True)
        self._relay.start()
        try:
            pickle.dump(start, self.proc.stdin)
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died at once; its exit code and output tell why
            pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if it still runs after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def last_output(self, lines: int = TAIL_LINES) -> str:
        """Its last stderr lines (all of them relayed once it has exited)."""
        if self.log_file is not None:
            return log_tail(self.log_file, lines)
        if self.exited():
            self._relay.join(timeout=2)
        return "".join(list(self.tail)[-lines:]) or "(none)\n"

    def describe_exit(self) -> str:
        """"exited with code 1" / "was killed by SIGKILL" (after it exited)."""
        code = self.proc.poll()
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return f"exited with code {code}"

    def kill(self) -> None:
        """Kill it if it still runs and release its pipes (idempotent)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.release()
        self._relay.join(timeout=5)

    def release(self) -> None:
        """Close our end of its stdin (a child that watches it exits); reap it once it exits."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        if self.proc.poll() is None:
            threading.Thread(target=self.proc.wait, name=f"{self.label}-reaper".replace(" ", "-"),
                             daemon=True).start()


def _relay(stream, label: str, tail: collections.deque) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        tail.append(line)
        sys.stderr.write(f"[{label}] {line}")
    stream.close()


def _relay_file(path: Path, label: str, tail: collections.deque, proc: subprocess.Popen) -> None:
    """_relay for a child whose stderr is a file: its new lines, until it has exited and all are read."""
    with open(path, "rb") as log:
        log.seek(0, os.SEEK_END)
        partial = b""
        while True:
            done = proc.poll() is not None
            chunk = log.read()
            if chunk:
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for raw in lines:
                    line = raw.decode(errors="replace") + "\n"
                    tail.append(line)
                    sys.stderr.write(f"[{label}] {line}")
            elif done:
                return
            else:
                time.sleep(LOG_POLL_S)


def log_tail(log: Path | BinaryIO, lines: int = TAIL_LINES, max_bytes: int = 1 << 16) -> str:
    """The last `lines` lines of a log file, by path or open in binary ("(none)" when empty or gone)."""
    try:
        if isinstance(log, (str, Path)):
            with open(log, "rb") as f:
                return log_tail(f, lines, max_bytes)
        size = os.fstat(log.fileno()).st_size
        text = os.pread(log.fileno(), max_bytes, max(0, size - max_bytes)).decode(errors="replace")
    except OSError:
        text = ""
    kept = text.splitlines(keepends=True)[-lines:]
    return "".join(kept) or "(none)\n"


def read_start_message() -> dict:
    """The child's side: its start message from stdin, and from now on a thread that ends this
    process as soon as the parent is gone (stdin at end of file), whatever it is doing; unless the
    message says `outlive_parent` (a shared engine: it ends when its last client leaves)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when its children stop
    start = pickle.load(sys.stdin.buffer)
    if not start.get("outlive_parent"):
        threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    return start


def _exit_with_parent() -> None:
    while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a buffered read would block interpreter exit
        pass
    os._exit(1)
