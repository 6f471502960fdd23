"""Shared by the server tests: server options on free ports, the test-only repository, and POSTs to
the HTTP endpoints (the generate endpoint shows an error's status code, which a gRPC stream drops)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from ragstack.launcher import ServerOptions, free_port

FIXTURE_REPOSITORY = Path(__file__).resolve().parent / "fixtures" / "model_repository"


def free_server_options(**overrides) -> ServerOptions:
    options = ServerOptions(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=10)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options


def http_post(url: str, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
