"""Stepping an LLMEngine in tests until it has nothing left to run."""
from __future__ import annotations


def drain(engine, max_steps=500):
    """Step until idle; every output per request, in order."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine did not finish")
