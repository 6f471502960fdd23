"""The OpenAI frontend's pooling batches (embeddings, rerank, score): the first batch that fails cancels the
others, those sent and those waiting on the gate, so a refused request stops loading Triton once its error
is the answer. Triton is a stand-in here; the frontend against the real server: tests/server/test_openai_score.py
(requests of many batches at once within the reranker's queue)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ragstack.openai_frontend import pooling
from ragstack.openai_frontend.errors import APIError


class Request:
    """Starlette's request as unless_gone reads it: a client that stays."""

    async def receive(self):
        await asyncio.Event().wait()


class Triton:
    """One model without a tokenizer step; batch 1 fails once the first batches are in flight."""

    def __init__(self):
        self.sent, self.finished = [], []

    async def config(self, model: str):
        return {}

    async def infer(self, model: str, inputs: dict, params: dict):
        n = int(inputs["n"][0])
        self.sent.append(n)
        await asyncio.sleep(0.05 if n == 1 else 0.5)
        if n == 1:
            raise APIError(503, "the model's queue is full")
        self.finished.append(n)
        return {"scores": np.zeros(1)}


def test_the_first_failed_batch_cancels_the_batches_in_flight_and_those_waiting():
    async def scenario() -> Triton:
        triton = Triton()
        batches = [{"n": np.array([n])} for n in range(10)]
        with pytest.raises(APIError, match="queue is full"):
            await pooling.run(Request(), triton, "rerank", batches, {}, asyncio.Semaphore(4))
        await asyncio.sleep(0.6)   # what was not cancelled would finish meanwhile
        return triton

    triton = asyncio.run(scenario())
    assert sorted(triton.sent) == [0, 1, 2, 3]   # the gate held the other six back
    assert triton.finished == []
