"""The OpenAI frontend's pooling batches (embeddings, rerank, score): the first failure cancels every other
part of the request, the batches sent, those waiting on the gate and a batch's own token count, so a refused
request stops loading Triton once its error is the answer; and a request behind a large one waits for the
next free slot of the worker's gate, not behind the large one's batches. Triton is a stand-in here; the
frontend against the real server: tests/server/test_openai_score.py (many batches at once within the
reranker's queue)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from ragstack.openai_frontend import pooling
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.frontend import Gate

COUNTED = {"ensemble_scheduling": {"step": [{"model_name": "tokenizer", "input_map": {"text": "n"},
                                              "output_map": {"attention_mask": "attention_mask"}}]}}


class Request:
    """Starlette's request as unless_gone reads it: a client that stays."""

    async def receive(self):
        await asyncio.Event().wait()


class Triton:
    """A model whose batch `failing` fails after `fail_after` s (and, with `counted`, whose tokenizer step
    fails at once for it); every other call takes `seconds`."""

    def __init__(self, failing: int = -1, seconds: float = 0.5, fail_after: float = 0.05, counted: bool = False):
        self.failing, self.seconds, self.fail_after, self.counted = failing, seconds, fail_after, counted
        self.sent, self.finished = [], []

    async def config(self, model: str):
        return COUNTED if self.counted else {}

    async def infer(self, model: str, inputs: dict, params: dict):
        n = int(next(iter(inputs.values()))[0])
        if model == "tokenizer":
            if n == self.failing:
                raise APIError(400, "the tokenizer refused it")
            return {"attention_mask": np.ones((1, 3))}
        self.sent.append(n)
        await asyncio.sleep(self.fail_after if n == self.failing and not self.counted else self.seconds)
        if n == self.failing and not self.counted:
            raise APIError(503, "the model's queue is full")
        self.finished.append(n)
        return {"scores": np.zeros(1)}


def batches(first: int, count: int) -> list[dict]:
    return [{"n": np.array([n])} for n in range(first, first + count)]


def test_the_first_failed_batch_cancels_the_batches_in_flight_and_those_waiting():
    async def scenario() -> Triton:
        triton = Triton(failing=1)
        with pytest.raises(APIError, match="queue is full"):
            await pooling.run(Request(), triton, "rerank", batches(0, 10), {}, Gate.of(4))
        await asyncio.sleep(0.6)   # what was not cancelled would finish meanwhile
        return triton

    triton = asyncio.run(scenario())
    # the gate held the other six back; the failed batch's slot may pass to the next as the group cancels,
    # which cancels it too
    assert set(triton.sent) <= {0, 1, 2, 3, 4}
    assert triton.finished == []


def test_a_failed_token_count_cancels_its_own_batch():
    async def scenario() -> Triton:
        triton = Triton(failing=0, counted=True)
        with pytest.raises(APIError, match="tokenizer refused"):
            await pooling.run(Request(), triton, "rerank", batches(0, 1), {}, Gate.of(8))
        await asyncio.sleep(0.6)
        return triton

    assert asyncio.run(scenario()).finished == []


def test_a_request_behind_a_large_one_waits_for_one_slot_not_for_it():
    """40 batches of 50 ms through a gate of 8 take 0.25 s; a one-batch request sent just after them gets the
    next slot that frees, as the large one's other 32 batches wait on slots of their own."""
    async def scenario() -> float:
        triton, gate = Triton(seconds=0.05), Gate.of(8)
        large = asyncio.create_task(pooling.run(Request(), triton, "rerank", batches(0, 40), {}, gate))
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        await pooling.run(Request(), triton, "rerank", batches(100, 1), {}, gate)
        waited = time.perf_counter() - start
        await large
        return waited

    assert asyncio.run(scenario()) < 0.2
