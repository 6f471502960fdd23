"""What the client subcommands share: --url/--protocol and the TLS options, and exit codes scripts can rely on:
0 ok, 1 server or request error (RagstackError), 2 usage error. Messages go to stderr."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from ragstack.results import RagstackError

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(ValueError):
    """A command line that cannot be carried out as given."""


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="server host:port (default $RAGSTACK_URL, else localhost:8001 for gRPC, "
                                      "localhost:8000 for HTTP)")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for a response")
    tls = parser.add_argument_group("TLS", "a server behind a TLS-terminating proxy; an https:// or grpcs:// "
                                           "--url, or any of these options, connects with TLS")
    tls.add_argument("--ssl", action="store_true", help="connect with TLS")
    tls.add_argument("--ssl-ca", metavar="FILE", help="PEM certificates of the CAs to trust (default: the "
                                                      "system's for HTTP, gRPC's bundled roots for gRPC)")
    tls.add_argument("--ssl-cert", metavar="FILE", help="client certificate (PEM), for a server that asks for one")
    tls.add_argument("--ssl-key", metavar="FILE", help="the client certificate's key (PEM; default: in --ssl-cert)")
    tls.add_argument("--insecure", action="store_true",
                     help="HTTP only: do not check the server's certificate (testing only)")


def tls_arguments(args: argparse.Namespace):
    """The TLS options of the command line: TlsOptions, or None where none is given (the URL decides)."""
    from ragstack.tls import TlsOptions  # noqa: PLC0415

    if not (args.ssl or args.ssl_ca or args.ssl_cert or args.ssl_key or args.insecure):
        return None
    return TlsOptions(ca_file=args.ssl_ca, cert_file=args.ssl_cert, key_file=args.ssl_key, insecure=args.insecure)


def connect(args: argparse.Namespace):
    from ragstack.client import RagClient  # noqa: PLC0415

    try:
        return RagClient(args.url, args.protocol, timeout_s=args.timeout, tls=tls_arguments(args))
    except ValueError as exc:  # a --url (or $RAGSTACK_URL) that is not host:port; TLS options that contradict
        raise UsageError(str(exc)) from None


def run_reporting(name: str, body: Callable[[], int]) -> int:
    """Runs a subcommand body and turns its failures into a message and an exit code."""
    try:
        return body()
    except RagstackError as exc:
        print(f"ragstack {name}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except UsageError as exc:
        print(f"ragstack {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"ragstack {name}: interrupted", file=sys.stderr)
        return 130
