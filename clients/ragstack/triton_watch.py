"""`python -m ragstack.triton_watch [--grace-s S] -- tritonserver ARGS...`: the server with a watch on its
output, for containers that restart their main process only when it exits (docker-compose.yml).

Triton 2.51's crash handler can hang after `Signal (11) received.` (ragstack.fatal_signal): the process
lives on, answering nothing, and its container is never restarted. This runs the server as its child in
a process group of its own, passes its output through, and on a crash line gives it `--grace-s` seconds
to exit by itself, then kills the group (the Python stubs and engine processes too) and exits with
128 + the signal, as a shell reports a process killed by it. SIGTERM and SIGINT are passed on to the
server (its own drain: --exit-timeout-secs); otherwise this exits with the server's code."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from ragstack.fatal_signal import fatal_signal
from ragstack.parent_death import dying_with_parent


def _relay(stream, out) -> int | None:
    """Copies `stream`'s lines to `out` until a crash line (its signal) or the end (None)."""
    for line in stream:
        out.write(line)
        out.flush()
        number = fatal_signal(line)
        if number is not None:
            return number
    return None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def watch(command: list[str], grace_s: float, out=None) -> int:
    out = out or sys.stdout.buffer
    server = subprocess.Popen(dying_with_parent(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    previous = {stop: signal.signal(stop, lambda signum, _frame: server.send_signal(signum))
                for stop in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _watch(server, grace_s, out)
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def _watch(server: subprocess.Popen, grace_s: float, out) -> int:
    crash = _relay(server.stdout, out)
    if crash is None:
        return _exit_code(server.wait())
    # the handler's backtrace keeps coming while the grace period runs
    threading.Thread(target=_relay, args=(server.stdout, out), daemon=True).start()
    try:
        return _exit_code(server.wait(timeout=grace_s))
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    out.write(f"[triton_watch] tritonserver logged 'Signal ({crash}) received.' and was still running "
              f"{grace_s:g} s later: killed with its process group\n".encode())
    out.flush()
    return 128 + crash


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragstack.triton_watch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grace-s", type=float, default=10.0,
                        help="seconds a crashed server gets to exit by itself (default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the server's command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the server's command is missing: python -m ragstack.triton_watch -- tritonserver ...")
    if args.grace_s < 0:
        parser.error(f"--grace-s must be >= 0, got {args.grace_s:g}")
    return watch(command, args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
