"""A helper process of the engine, `python -m <module>`, and the child's side of the arrangement.

The parent writes the child's start message (pickled) to its stdin, which then stays open for the
parent's lifetime: the child watches it (`read_start_message`) and exits at end of file, so a
parent that dies, even by SIGKILL, leaves no child behind. The child's stderr is relayed line by
line, with a prefix, to the parent's stderr, and its last lines are kept for the error the parent
raises when the child fails. Used for the tensor-parallel workers (worker_group.py) and the
engine process (engine/process_client.py).
"""
from __future__ import annotations

import collections
import os
import pickle
import signal
import subprocess
import sys
import threading

TAIL_LINES = 40         # of a failed child's output, quoted in the error


class ChildProcess:
    def __init__(self, module: str, start: dict, label: str, pass_fds: tuple[int, ...] = ()) -> None:
        """Start `python -m module` and send it `start`; its stderr lines go out as `[label] ...`."""
        self.label = label
        self.proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                     stderr=subprocess.PIPE, pass_fds=pass_fds)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._relay = threading.Thread(target=_relay, args=(self.proc.stderr, label, self.tail),
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
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self._relay.join(timeout=5)


def _relay(stream, label: str, tail: collections.deque) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        tail.append(line)
        sys.stderr.write(f"[{label}] {line}")
    stream.close()


def read_start_message() -> dict:
    """The child's side: its start message from stdin, and from now on a thread that ends this
    process as soon as the parent is gone (stdin at end of file), whatever it is doing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when its children stop
    start = pickle.load(sys.stdin.buffer)
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    return start


def _exit_with_parent() -> None:
    while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a buffered read would block interpreter exit
        pass
    os._exit(1)
