"""AsyncLLMEngine on the counting fake model (see conftest.CountingRunner)."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM
from llm_engine.engine.async_engine import AsyncLLMEngine
from llm_engine.errors import EngineClosedError, EngineOverloadedError, RequestFailedError
from llm_engine.sampling_params import SamplingParams


@pytest.fixture
def make_async(fake_engine):
    engines = []

    def make(**config):
        engine = AsyncLLMEngine(fake_engine(**config))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown(timeout=0)


def params(**kw):
    kw.setdefault("temperature", 0)
    return SamplingParams(**kw)


async def collect(stream):
    return [out async for out in stream]


def test_streams_deltas_that_add_up_to_the_text(make_async):
    engine = make_async()

    async def main():
        streams = [engine.add_request(f"r{i}", chr(ord("a") + i), params(max_tokens=6)) for i in range(4)]
        return await asyncio.gather(*(collect(s) for s in streams))

    for i, outs in enumerate(asyncio.run(main())):
        start = ord("a") + i
        assert outs[-1].finished and outs[-1].text == "".join(chr(start + k) for k in range(1, 7))
        assert "".join(o.delta_text for o in outs) == outs[-1].text
        # one output per token, unless the consumer fell behind and got some merged
        assert sum(len(o.delta_token_ids) for o in outs) == 6 and len(outs) <= 6


def test_abort_mid_stream_ends_with_abort_and_frees_blocks(make_async):
    engine = make_async()
    # 2 ms steps, so the request is still generating when the abort arrives, on a busy machine too.
    engine.engine.model_runner.fail_when = lambda batch: time.sleep(0.002)

    async def main():
        stream = engine.add_request("r", "a", params(max_tokens=100, ignore_eos=True))
        outs = []
        async for out in stream:
            outs.append(out)
            if len(outs) == 3:
                engine.abort("r")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort"
    assert 3 <= len(outs) < 100
    assert "".join(o.delta_text for o in outs) == outs[-1].text
    assert engine.engine.get_stats().kv_blocks_used == 0


def test_a_cancelled_consumer_aborts_its_request(make_async):
    engine = make_async()
    # 5 ms steps (the hook returns None: no failure), so the request is still generating when the
    # consumer is cancelled; a fast engine would finish it first, its outputs merged.
    engine.engine.model_runner.fail_when = lambda batch: time.sleep(0.005)
    done = threading.Event()

    async def main():
        stream = engine.add_request("r", "a", params(max_tokens=100, ignore_eos=True))

        async def consume():
            async for _ in stream:
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # the engine thread applies the abort before its next step
            if not engine.engine.has_unfinished_requests():
                done.set()
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert done.is_set() and engine.engine.get_stats().kv_blocks_used == 0


def test_bad_input_raises_at_add_request_and_others_keep_streaming(make_async):
    engine = make_async(max_waiting=2)

    async def main():
        good = engine.add_request("good", "a", params(max_tokens=3))
        with pytest.raises(ValueError, match="top_p must be in"):
            engine.add_request("bad", "a", {"top_p": 2})
        with pytest.raises(ValueError, match="prompt must not be empty"):
            engine.add_request("empty", "")
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request("good", "b")
        return await collect(good)

    assert asyncio.run(main())[-1].text == "bcd"


def test_overload_is_reported_when_the_waiting_queue_is_full(make_async):
    engine = make_async(max_waiting=1, max_num_seqs=1)

    async def main():
        first = engine.add_request("first", "a", params(max_tokens=100, ignore_eos=True))
        await first.__anext__()  # running now: with max_num_seqs=1 the next one must wait
        second = engine.add_request("second", "a", params(max_tokens=2))
        with pytest.raises(EngineOverloadedError, match="max_waiting=1"):
            engine.add_request("third", "a", params(max_tokens=2))
        engine.abort("first")
        return await collect(first), await collect(second)

    first, second = asyncio.run(main())
    assert first[-1].finish_reason == "abort" and second[-1].text == "bc"


def test_a_failed_request_raises_and_the_loop_serves_on(make_async):
    engine = make_async()
    engine.engine.model_runner.fail_when = lambda batch: any(s.request_id == "poison" for s in batch.seqs)

    async def main():
        with pytest.raises(RequestFailedError, match="injected model failure"):
            await collect(engine.add_request("poison", "a", params(max_tokens=3)))
        return await collect(engine.add_request("next", "a", params(max_tokens=3)))

    assert asyncio.run(main())[-1].text == "bcd"


def test_shutdown_finishes_in_flight_requests_then_refuses_new_ones(make_async):
    engine = make_async()

    async def main():
        stream = engine.add_request("r", "a", params(max_tokens=5))
        await asyncio.to_thread(engine.shutdown, 30)
        outs = await collect(stream)
        with pytest.raises(EngineClosedError):
            engine.add_request("late", "a")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "length" and outs[-1].text == "bcdef"


def test_shutdown_timeout_aborts_what_is_left(make_async):
    engine = make_async()

    async def main():
        stream = engine.add_request("r", "a", params(max_tokens=120, ignore_eos=True))
        engine.shutdown(timeout=0)
        return await collect(stream)

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort"
    assert engine.engine.get_stats().kv_blocks_used == 0


def test_streaming_a_real_model(tiny_checkpoints):
    llm = LLM(str(tiny_checkpoints["tiny-qwen2"]), device="cpu", max_model_len=256)
    prompts = ["The quick brown fox", "Each request is split into tokens."]
    p = params(max_tokens=24, ignore_eos=True)
    expected = [o.text for o in llm.generate(prompts, p)]
    engine = AsyncLLMEngine(llm.engine)
    try:
        async def main():
            streams = [engine.add_request(f"r{i}", prompt, p) for i, prompt in enumerate(prompts)]
            aborted = engine.add_request("aborted", prompts[0], params(max_tokens=200, ignore_eos=True))
            outs = []
            async for out in aborted:
                outs.append(out)
                if len(outs) == 2:
                    engine.abort("aborted")
            return await asyncio.gather(*(collect(s) for s in streams)), outs

        done, aborted = asyncio.run(main())
    finally:
        engine.shutdown(timeout=5)
    for outs, text in zip(done, expected):
        assert "".join(o.delta_text for o in outs) == outs[-1].text == text
        assert outs[-1].finish_reason == "length"
    assert aborted[-1].finish_reason == "abort" and len(aborted[-1].token_ids) < 200
    assert llm.engine.get_stats().kv_blocks_used == 0


def test_a_slow_consumer_gets_the_outputs_it_missed_merged(make_async):
    engine = make_async()

    async def main():
        outputs = []
        async for out in engine.add_request("r", "a", params(max_tokens=20, ignore_eos=True)):
            outputs.append(out)
            if len(outputs) == 1:
                await asyncio.sleep(0.2)  # the engine runs ahead meanwhile
        return outputs

    outputs = asyncio.run(main())
    assert len(outputs) < 20 and outputs[-1].finished
    assert "".join(o.delta_text for o in outputs) == outputs[-1].text
    assert [t for o in outputs for t in o.delta_token_ids] == outputs[-1].token_ids
