"""`ragstack demo` (the README's first command): start the bundled server on free ports, talk
to it over gRPC, stop it."""
from __future__ import annotations

import argparse
import sys

from ragstack.launcher import LauncherError, ServerOptions, TritonServer, free_port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--query", default="How does Triton batch requests?",
                        help="the question to send")


def run(args: argparse.Namespace) -> int:
    import tritonclient.grpc as grpcclient

    options = ServerOptions(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port())
    print("[demo] starting the bundled Triton server on the CPU ...", flush=True)
    try:
        with TritonServer(options) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            print(f"[demo] server ready at gRPC {server.grpc_url}: "
                  f"live={client.is_server_live()} ready={client.is_server_ready()}")
            for model in client.get_model_repository_index(as_json=True).get("models", []):
                print(f"[demo]   model {model['name']:<16} version {model.get('version', '-'):<3} "
                      f"{model.get('state', 'UNAVAILABLE')}")
            client.close()
    except LauncherError as exc:
        print(f"[demo] error: {exc}", file=sys.stderr)
        return 1
    print("[demo] server stopped")
    return 0
