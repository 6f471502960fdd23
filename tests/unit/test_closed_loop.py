"""bench_serving's closed loop: each slot sends its next request as its last one ends, and a request's clock
starts when its slot became free, so the time it waits for the event loop (here a synchronous step, as the
in-process engine's tokenizing) counts."""
from __future__ import annotations

import asyncio
import time

from benchmarks.bench_serving import Result, closed_loop

WORK_S, WAIT_S = 0.03, 0.01


def test_a_request_is_timed_from_when_its_slot_became_free():
    sent: list[tuple[int, float, float]] = []

    async def send(i: int, request: str, start: float) -> Result:
        sent.append((i, start, time.perf_counter()))
        time.sleep(WORK_S)               # holds the event loop, as tokenizing in it does
        await asyncio.sleep(WAIT_S)
        return Result(time.perf_counter() - start, [], 1)

    results, elapsed = asyncio.run(closed_loop(["a", "b", "c", "d", "e"], 2, send))
    assert [r.tokens for r in results] == [1] * 5
    starts = {i: start for i, start, _ in sent}
    assert starts[0] == starts[1]                         # both slots free at the start
    assert results[1].ttft >= 2 * WORK_S                  # it waited for request 0's synchronous work
    entered = {i: at for i, _, at in sent}
    assert all(entered[i] >= starts[i] for i in starts)
    assert elapsed >= 5 * WORK_S


def test_each_slots_first_request_is_the_ramp():
    async def send(i: int, request: str, start: float) -> Result:
        await asyncio.sleep(0.001 * (i + 1))
        return Result(time.perf_counter() - start, [], 1)

    results, _ = asyncio.run(closed_loop(list("abcdefg"), 3, send))
    assert [r.ramp for r in results] == [True, True, True, False, False, False, False]
