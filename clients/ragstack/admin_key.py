"""The admin key ($RAGSTACK_ADMIN_KEY): the server answers its administrative APIs only to requests
that carry it; inference, health and metadata stay open.

Triton enforces it (--http-restricted-api / --grpc-restricted-protocol). Over HTTP the key goes in
the header `x-ragstack-admin-key`; over gRPC Triton expects every restricted protocol's header with
the prefix `triton-grpc-protocol-`. The same flags serve `ragstack serve` and docker-compose.yml.
"""
from __future__ import annotations

import os
import re

ENV = "RAGSTACK_ADMIN_KEY"
HEADER = "x-ragstack-admin-key"
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"
# The repository API loads, unloads and (with a config override) uploads model files, so it can run
# code; shared-memory registration lets a client map regions of the server; trace and logging
# settings could write request contents out.
RESTRICTED = ("model-repository", "shared-memory", "trace", "logging")
# Triton parses "<apis>:<header>=<key>": no ':', '=' or ',' in the key, and long enough to guess hard.
_KEY = re.compile(r"[A-Za-z0-9._~+/-]{16,}")


def from_environment() -> str | None:
    return os.environ.get(ENV) or None


def check(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"{ENV} must be 16 or more of A-Z a-z 0-9 . _ ~ + / - "
                         "(e.g. `openssl rand -hex 16`)")
    return key


def server_args(key: str) -> list[str]:
    rule = f"{','.join(RESTRICTED)}:{HEADER}={check(key)}"
    return [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]


def headers(protocol: str, key: str | None) -> dict[str, str]:
    """What a client sends with administrative calls (nothing without a key)."""
    if not key:
        return {}
    return {HEADER if protocol == "http" else GRPC_HEADER: key}
