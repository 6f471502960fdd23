"""One real Triton server for the whole test run, on free ports, stopped at the end."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragstack.launcher import DEFAULT_REPOSITORIES, ServerOptions, TritonServer, free_port

TESTS = Path(__file__).resolve().parent
FIXTURE_REPOSITORY = TESTS / "fixtures" / "model_repository"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def free_server_options(**overrides) -> ServerOptions:
    options = ServerOptions(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=10)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory):
    """The project's repositories plus the test fixtures' repository; every model loaded at start."""
    options = free_server_options(model_repositories=[*DEFAULT_REPOSITORIES, FIXTURE_REPOSITORY])
    server = TritonServer(options, work_dir=tmp_path_factory.mktemp("triton"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
