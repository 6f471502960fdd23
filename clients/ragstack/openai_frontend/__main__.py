"""`python -m ragstack.openai_frontend --listen 0.0.0.0:9000 --triton triton:8001`: the OpenAI API in
front of Triton's gRPC port (ragstack.openai_frontend). The API key comes from --api-key-file or
$RAGSTACK_OPENAI_API_KEY; $RAGSTACK_ADMIN_KEY, where set, is what the repository calls send and what
model load and unload ask of their callers."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn

from ragstack import admin_key
from ragstack.gateway.__main__ import host_port
from ragstack.openai_frontend import keys
from ragstack.openai_frontend import limits as frontend_limits
from ragstack.openai_frontend.app import create_app

IDLE_TIMEOUT_S = 30   # a kept-alive connection without a request


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragstack.openai_frontend", description=__doc__)
    parser.add_argument("--listen", type=host_port, required=True, help="HOST:PORT clients connect to")
    parser.add_argument("--triton", required=True, help="HOST:PORT of tritonserver's gRPC endpoint")
    parser.add_argument("--api-key-file", type=Path,
                        help=f"a file holding the API key clients must send (default: ${keys.ENV}; neither: open)")
    parser.add_argument("--exit-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish on SIGTERM/SIGINT")
    frontend_limits.add_arguments(parser)
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
    config = uvicorn.Config(create_app(args.triton, limits, api_key, key), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=int(args.exit_timeout),
                            timeout_keep_alive=IDLE_TIMEOUT_S, server_header=False)
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
