"""Shared by the server tests: server options on free ports, and the test-only repository."""
from __future__ import annotations

from pathlib import Path

from ragstack.launcher import ServerOptions, free_port

FIXTURE_REPOSITORY = Path(__file__).resolve().parent / "fixtures" / "model_repository"


def free_server_options(**overrides) -> ServerOptions:
    options = ServerOptions(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=10)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options
