"""`python -m ragstack.triton_watch [--grace-s S] -- tritonserver ARGS...`: the server with a watch on its
output, for containers that restart their main process only when it exits (docker-compose.yml).

Triton 2.51's crash handler can hang after `Signal (11) received.` (ragstack.fatal_signal): the process
lives on, answering nothing, and its container is never restarted. This runs the server as its child in
a process group of its own, passes its output through, and on a crash line gives it `--grace-s` seconds
to exit by itself, then kills the group (the Python stubs and engine processes too) and exits with
128 + the signal, as a shell reports a process killed by it. SIGTERM and SIGINT are passed on to the
server (its own drain: --exit-timeout-secs); otherwise this exits with the server's code. Beside it runs
the stub watch (ragstack.stub_watch: a model whose Python stub died is reloaded) against the server's
own HTTP port (`--http-port`, default 8000), with $RAGSTACK_ADMIN_KEY where the repository API needs it."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from ragstack import admin_key
from ragstack.fatal_signal import fatal_signal
from ragstack.parent_death import dying_with_parent
from ragstack.stub_watch import StubWatch


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


def http_url(command: list[str]) -> str:
    """Triton's own HTTP endpoint from its flags, as this host reaches it."""
    flags = dict(arg[2:].split("=", 1) for arg in command if arg.startswith("--http-") and "=" in arg)
    flags.update((a[2:], b) for a, b in zip(command, command[1:]) if a in ("--http-port", "--http-address"))
    address = flags.get("http-address", "127.0.0.1")
    return f"{'127.0.0.1' if address in ('0.0.0.0', '::', '') else address}:{flags.get('http-port', '8000')}"


def watch(command: list[str], grace_s: float, out=None, stub_watch_interval_s: float = 0) -> int:
    out = out or sys.stdout.buffer
    server = subprocess.Popen(dying_with_parent(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    previous = {stop: signal.signal(stop, lambda signum, _frame: server.send_signal(signum))
                for stop in (signal.SIGTERM, signal.SIGINT)}
    stubs = None
    if stub_watch_interval_s > 0:
        stubs = StubWatch(server.pid, http_url(command), admin_key.headers("http", admin_key.from_environment()),
                          stub_watch_interval_s, log=lambda line: (out.write(f"{line}\n".encode()), out.flush()))
        stubs.start()
    try:
        return _watch(server, grace_s, out)
    finally:
        if stubs is not None:
            stubs.stop()
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
    parser.add_argument("--stub-watch-interval-s", type=float, default=2.0,
                        help="how often to look for dead Python stubs, whose models are reloaded (default 2; 0: never)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the server's command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the server's command is missing: python -m ragstack.triton_watch -- tritonserver ...")
    if args.grace_s < 0:
        parser.error(f"--grace-s must be >= 0, got {args.grace_s:g}")
    if args.stub_watch_interval_s < 0:
        parser.error(f"--stub-watch-interval-s must be >= 0, got {args.stub_watch_interval_s:g}")
    return watch(command, args.grace_s, stub_watch_interval_s=args.stub_watch_interval_s)


if __name__ == "__main__":
    sys.exit(main())
