"""`ragstack serve`: run the real Triton server in the foreground until Ctrl-C or SIGTERM.

HTTP clients reach it through the gateway (ragstack.gateway) on --address/--http-port, whose limits
are the flags of the "HTTP gateway limits" group. The OpenAI API (ragstack.openai_frontend) listens on
--openai-port (9000; 0: none), its limits the "OpenAI frontend limits" group; its API key, if any, comes
from --openai-api-key-file or $RAGSTACK_OPENAI_API_KEY. With $RAGSTACK_ADMIN_KEY set, the repository API
(and the other admin APIs, ragstack.admin_key) answers only requests carrying that key; without it
they are open to whoever reaches the ports, which on the default loopback address is this machine only.
If tritonserver, the gateway or the frontend exits, or tritonserver logs a crash (ragstack.fatal_signal),
serve stops the rest and exits 1, for a supervisor to restart it.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from ragstack import admin_key, openai_frontend
from ragstack.gateway import limits as gateway_limits
from ragstack.launcher import DEFAULT_REPOSITORIES, LauncherError, ServerOptions, TritonServer
from ragstack.openai_frontend import keys as openai_keys
from ragstack.openai_frontend import limits as openai_limits

LOOPBACK = ("127.0.0.1", "localhost")


def _port(lowest: int):
    """argparse's type for a port number from `lowest` to 65535."""
    def port(text: str) -> int:
        if not text.isdigit() or not lowest <= int(text) <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port ({lowest} to 65535)")
        return int(text)
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-repository", action="append", type=Path, dest="repositories",
                        help="a model repository (repeatable; default: model_repository and ensembles)")
    parser.add_argument("--models", default="*",
                        help="comma-separated models to load at start (default '*': every model)")
    parser.add_argument("--address", default="127.0.0.1",
                        help="IPv4 bind address of HTTP, gRPC, metrics and the OpenAI API (default 127.0.0.1, "
                             "loopback only)")
    parser.add_argument("--http-port", type=_port(1), default=8000,
                        help="the HTTP port (Triton's API through the gateway; default 8000)")
    parser.add_argument("--grpc-port", type=_port(1), default=8001, help="Triton's gRPC port (default 8001)")
    parser.add_argument("--metrics-port", type=_port(1), default=8002,
                        help="Triton's Prometheus metrics port (default 8002)")
    parser.add_argument("--openai-port", type=_port(0), default=openai_frontend.DEFAULT_PORT,
                        help=f"the OpenAI API's port (default {openai_frontend.DEFAULT_PORT}; 0: no OpenAI API)")
    parser.add_argument("--openai-api-key-file", type=Path,
                        help=f"a file holding the key OpenAI API clients must send as a bearer token (default: "
                             f"${openai_keys.ENV} if set; neither: the API is open)")
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level")
    parser.add_argument("--exit-timeout", type=int, default=30,
                        help="seconds in-flight requests get to finish on shutdown (default 30)")
    parser.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds to wait for every model to load (default 300)")
    parser.add_argument("server_args", nargs="*",
                        help="further tritonserver flags, after `--` (e.g. -- --log-info=false)")
    gateway_limits.add_arguments(parser)
    openai_limits.add_arguments(parser)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(
        model_repositories=args.repositories or list(DEFAULT_REPOSITORIES),
        models=[m.strip() for m in args.models.split(",") if m.strip()],
        address=args.address, http_port=args.http_port, grpc_port=args.grpc_port,
        metrics_port=args.metrics_port, log_verbose=args.log_verbose,
        exit_timeout_s=args.exit_timeout, startup_timeout_s=args.startup_timeout,
        admin_key=admin_key.from_environment(), extra_args=list(args.server_args),
        gateway=gateway_limits.from_args(args), openai_port=args.openai_port,
        openai=openai_limits.from_args(args), openai_api_key_file=args.openai_api_key_file)


def run(args: argparse.Namespace) -> int:
    try:
        if args.openai_port:
            openai_keys.api_key(args.openai_api_key_file)   # a bad key refused before anything starts
        server = TritonServer(options_from_args(args))
    except (ValueError, OSError) as exc:  # a gateway or OpenAI frontend limit out of range, a key unread
        print(f"[serve] error: {exc}", file=sys.stderr)
        return 2
    stop_requested = threading.Event()

    def request_stop(signum, _frame):
        print(f"\n[serve] {signal.Signals(signum).name}: stopping (in-flight requests finish first)",
              file=sys.stderr, flush=True)
        stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    print(f"[serve] starting tritonserver; log: {server.log_path}", flush=True)
    try:
        server.start()
    except LauncherError as exc:
        print(f"[serve] error: {exc}", file=sys.stderr)
        return 1
    print(f"[serve] ready  HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
          f"metrics {server.metrics_url}", flush=True)
    print(f"[serve] HTTP goes through the gateway (log: {server.gateway_log_path}) to tritonserver's own "
          f"http://{server.triton_http_url}, which listens on loopback only", flush=True)
    if server.options.openai_port:
        guarded = server.options.openai_api_key_file or openai_keys.api_key(None)
        print(f"[serve] OpenAI API {server.openai_url}/v1 (log: {server.openai_log_path})"
              f"{', API key required' if guarded else ''}", flush=True)
        if not guarded and server.options.address not in LOOPBACK:
            print(f"[serve] warning: no OpenAI API key (--openai-api-key-file or ${openai_keys.ENV}): anyone who "
                  f"reaches {server.options.address} can use the API", file=sys.stderr, flush=True)
    if server.options.admin_key:
        print(f"[serve] admin APIs ({', '.join(admin_key.RESTRICTED)}) need ${admin_key.ENV}", flush=True)
    else:
        print(f"[serve] warning: ${admin_key.ENV} is not set: anyone who reaches {server.options.address} can "
              "load and unload models", file=sys.stderr, flush=True)
    while not stop_requested.wait(0.5):
        report = server.exit_report()
        if report is not None:
            print(f"[serve] unexpectedly, {report}", file=sys.stderr)
            code = server.stop()  # a crashed server is killed at once: it may hang in its handler
            return code if code and code > 0 else 1
    code = server.stop()
    if code in (0, None):   # None: no server process was left to stop
        print("[serve] stopped (exit code 0)", flush=True)
        return 0
    # Not clean (Triton's exit timeout expired, or it was killed): a supervisor sees it in serve's status too.
    print(f"[serve] stopped (exit code {code}: not a clean stop; tritonserver's log says why)", file=sys.stderr,
          flush=True)
    return 1
