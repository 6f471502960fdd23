"""`python -m ragstack.gateway --listen 0.0.0.0:8000 --upstream triton:8000`: the HTTP gateway in
front of Triton (ragstack.gateway). The launcher starts it with the server; docker-compose runs it as
its own service. $RAGSTACK_ADMIN_KEY, where set, is what /livez's probe sends to the repository API."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ragstack import admin_key
from ragstack.gateway import limits as gateway_limits
from ragstack.gateway.app import ListenError, serve
from ragstack.log_rate_limit import RateLimit


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragstack.gateway", description=__doc__)
    parser.add_argument("--listen", type=host_port, required=True, help="HOST:PORT clients connect to")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of tritonserver's HTTP endpoint")
    parser.add_argument("--exit-timeout", type=float, default=30.0,
                        help="seconds requests in flight get to finish on SIGTERM/SIGINT")
    gateway_limits.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[gateway] %(levelname)s %(name)s: %(message)s")
    logging.getLogger().handlers[0].addFilter(RateLimit())
    key = admin_key.from_environment()
    try:
        limits = gateway_limits.from_args(args)
        gateway_limits.reserve_descriptors(limits)
        if key:
            admin_key.check(key)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(serve(*args.listen, args.upstream, limits, key, args.exit_timeout))
    except ListenError as exc:
        parser.exit(1, f"[gateway] error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
