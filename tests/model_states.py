"""Waiting for a model's version swap to settle: Triton's load returns once the new version is
ready, while the old one is still UNLOADING, and with strict readiness the server reports
not-ready until it is gone. Tests that swap versions wait here before handing the server on."""
from __future__ import annotations

import time

from ragstack.client import RagClient


def wait_until_settled(client: RagClient, name: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        states = [m.state for m in client.models() if m.name == name]
        if "READY" in states and not {"LOADING", "UNLOADING"} & set(states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} did not settle within {timeout_s} s: {states}")
        time.sleep(0.1)
