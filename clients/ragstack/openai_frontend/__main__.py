"""`python -m ragstack.openai_frontend --listen 0.0.0.0:9000 --triton triton:8001`: the OpenAI API in
front of Triton's gRPC port (ragstack.openai_frontend). The API key comes from --api-key-file or
$RAGSTACK_OPENAI_API_KEY; $RAGSTACK_ADMIN_KEY, where set, is what the repository calls send and what
model load and unload ask of their callers.

With --openai-workers N (> 1) this process binds the port and runs N worker processes (this module
with --listen-fd) that accept on that one socket, each its own event loop and gRPC channel to Triton;
their metrics go to a shared folder (prometheus_client's multiprocess mode) and each worker's /metrics
adds them up, and they share the count of requests in flight (inflight.py). A signal is passed on to the
workers. A worker killed by a signal (the OOM killer, a crash) is replaced, at most RESTARTS times a
RESTART_WINDOW_S; one that exits by itself (it failed to start) ends the others and this process."""
from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvicorn
from prometheus_client import multiprocess

from ragstack import admin_key, process_tree
from ragstack.gateway.__main__ import host_port
from ragstack.listen_socket import shown, tcp_listener
from ragstack.log_rate_limit import RateLimit
from ragstack.openai_frontend import inflight, keys
from ragstack.openai_frontend import limits as frontend_limits
from ragstack.openai_frontend.app import create_app
from ragstack.openai_frontend.connection import Connection
from ragstack.parent_death import dying_with_parent

RESTARTS, RESTART_WINDOW_S = 5, 60.0
MAX_DESCRIPTORS = 1 << 20
METRICS_PREFIX = "ragstack-openai-metrics-"   # then the supervisor's pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragstack.openai_frontend", description=__doc__)
    parser.add_argument("--listen", type=host_port, required=True, help="HOST:PORT clients connect to")
    parser.add_argument("--triton", required=True, help="HOST:PORT of tritonserver's gRPC endpoint")
    parser.add_argument("--api-key-file", type=Path,
                        help=f"a file holding the API key clients must send (default: ${keys.ENV}; neither: open)")
    parser.add_argument("--exit-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish on SIGTERM/SIGINT")
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)   # a worker: the socket its parent bound
    frontend_limits.add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    key = admin_key.from_environment()
    try:
        limits = frontend_limits.from_args(args)
        api_key = keys.api_key(args.api_key_file)
        if key:
            admin_key.check(key)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    host, port = args.listen
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
    else:
        sock = listen(host, port, limits.write_timeout_s)
        if sock is None:
            return 1
        if limits.workers > 1:
            return supervise(argv, sock, limits.workers)
    # h11 (connection.py), not httptools: under httptools a pipelining client that leaves is never seen (its
    # generation runs on, a line logged per chunk) and an HTTP/1.0 client gets chunked streams; h11 costs no more
    # here (bench_openai_frontend, docs/benchmarks-journal.md).
    config = uvicorn.Config(create_app(args.triton, limits, api_key, key), log_level="warning", http=Connection,
                            access_log=False, timeout_graceful_shutdown=int(args.exit_timeout),
                            timeout_keep_alive=limits.idle_timeout_s, server_header=False)
    limited_logs()
    more_descriptors()
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 1


def limited_logs() -> None:
    """uvicorn logs each malformed request, asyncio each accept that fails for want of file descriptors (up to
    the backlog's 2048 times a wakeup: CPython 3.11 retries at once): any client could fill the disk. Each of
    the two loggers has a budget of its own; the frontend's own errors have none."""
    logging.basicConfig(level=logging.WARNING, format="[openai] %(levelname)s %(name)s: %(message)s")
    for name in ("asyncio", "uvicorn.error"):
        logging.getLogger(name).addFilter(RateLimit())


def more_descriptors() -> None:
    """The open-file limit raised towards its hard limit (at most MAX_DESCRIPTORS): each connection holds a
    descriptor, and the usual soft limit (1024) is a few hundred clients with their streams' gRPC calls. Where
    the system refuses (macOS caps the soft limit below an unlimited hard one), the limit stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MAX_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass


def listen(host: str, port: int, write_timeout_s: float) -> socket.socket | None:
    """The API's socket, bound here rather than by uvicorn so that the address it got (port 0: any free
    one) is logged once it is bound; None (said why) if it cannot be. Its connections inherit TCP_NODELAY
    (listen_socket.py) and a TCP_USER_TIMEOUT of write_timeout_s: a stream ended for a client that takes nothing
    (disconnect.py) leaves asyncio closing the socket only once its unsent bytes are gone, and this has the kernel
    drop it."""
    try:
        sock = tcp_listener(host, port, backlog=2048)
        if hasattr(socket, "TCP_USER_TIMEOUT"):   # Linux
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(write_timeout_s * 1000))
    except OSError as exc:
        print(f"[openai] cannot listen on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return None
    print(f"[openai] listening on {shown(host)}:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    return sock


def supervise(argv: list[str], sock: socket.socket, workers: int) -> int:
    """Runs `workers` processes of this module on the bound socket; returns when they have all exited: 0
    after SIGTERM or SIGINT (passed on to them as SIGTERM), 1 when one exited by itself or died too often
    (the others stopped)."""
    _remove_orphaned_metrics()
    with tempfile.TemporaryDirectory(prefix=f"{METRICS_PREFIX}{os.getpid()}-") as metrics_dir:
        counts = os.path.join(metrics_dir, "inflight")
        inflight.create_file(counts, workers)

        def start(index: int) -> subprocess.Popen:
            env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
                   inflight.ENV: f"{counts}:{index}:{workers}"}
            command = [sys.executable, "-m", "ragstack.openai_frontend", *argv, "--listen-fd", str(sock.fileno())]
            return subprocess.Popen(dying_with_parent(command), pass_fds=[sock.fileno()], env=env)

        procs = [start(i) for i in range(workers)]
        print(f"[openai] {workers} workers (pids {', '.join(str(p.pid) for p in procs)})", file=sys.stderr,
              flush=True)
        failed, stop_signal, restarts = False, None, []

        def stop(signum=signal.SIGTERM, _frame=None) -> None:   # the loop acts on it: no replacement half done
            nonlocal stop_signal
            stop_signal = stop_signal or (signal.SIGTERM if signum == signal.SIGINT else signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop)
        stopped = False
        while any(proc.poll() is None for proc in procs):
            for i, proc in enumerate(procs):
                if stop_signal or proc.poll() is None:
                    continue
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_S]
                if proc.returncode < 0 and len(restarts) < RESTARTS:   # killed: replaced
                    restarts.append(now)
                    multiprocess.mark_process_dead(proc.pid, metrics_dir)   # its live gauges (in flight)
                    inflight.clear(counts, i)   # its requests are gone: the others may admit theirs
                    procs[i] = start(i)
                    print(f"[openai] worker {proc.pid} exited with code {proc.returncode}; started {procs[i].pid} "
                          "in its place", file=sys.stderr, flush=True)
                    continue
                why = "" if proc.returncode >= 0 else f", after {RESTARTS} replaced in {RESTART_WINDOW_S:g} s"
                print(f"[openai] worker {proc.pid} exited with code {proc.returncode}{why}; stopping the others",
                      file=sys.stderr, flush=True)
                failed = True
                stop()
            if stop_signal and not stopped:
                stopped = True
                sock.close()   # kept for replacements until now; new connections are refused, not queued
                for proc in procs:
                    if proc.poll() is None:
                        proc.send_signal(stop_signal)
            time.sleep(0.2)
        sock.close()
    # A worker stopped by the SIGTERM passed on exits by it: uvicorn raises the signal again once it has
    # shut down (or it came before uvicorn's handler), a clean stop like 0.
    return 1 if failed or any(proc.returncode not in (0, -signal.SIGTERM) for proc in procs) else 0


def _remove_orphaned_metrics() -> None:
    """The metrics folders of supervisors that were killed (SIGKILL skips their clean-up): each names its pid."""
    for folder in Path(tempfile.gettempdir()).glob(f"{METRICS_PREFIX}*"):
        pid = folder.name.removeprefix(METRICS_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not process_tree.is_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
