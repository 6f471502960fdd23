"""Clients of the session server (tests/conftest.py's `triton_server`) that the server tests share; a test
file that needs another `client` defines its own."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def client(triton_server):
    """The official `openai` package against the session server's OpenAI frontend."""
    from openai import OpenAI

    with OpenAI(base_url=f"{triton_server.openai_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def triton(triton_server):
    """The ragstack client over the session server's gRPC: what Triton's own doors answer."""
    from ragstack.client import RagClient

    with RagClient(triton_server.grpc_url) as c:
        yield c
