"""EngineProcessClient: the engine in a child process behind AsyncLLMEngine's interface (the tiny
Qwen2 checkpoint on the CPU): the same streams as in-process, bad input and overload raised at once
in add_request, abort, shutdown, a failed start, the engine process's death (open streams end, new
requests are refused) and the front end's (the engine process exits)."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)

from llm_engine import LLM, EngineClosedError, EngineConfig, EngineOverloadedError
from llm_engine.engine.process_client import EngineProcessClient
from llm_engine.errors import EngineDeadError, EngineStartError
from ragstack.process_tree import is_alive

pytestmark = pytest.mark.slow  # starts processes or compiles kernels: not in `make test-fast`

CONFIG = dict(device="cpu", max_model_len=128, max_num_seqs=4, max_waiting=3)
GREEDY = dict(temperature=0.0, max_tokens=16, ignore_eos=True)
LONG = dict(temperature=0.0, max_tokens=100, ignore_eos=True)
PROMPTS = ["The capital of France is", "Two plus two", "Retrieval augmented generation"]


def start(tiny_checkpoints, **overrides) -> EngineProcessClient:
    return EngineProcessClient(EngineConfig(model=str(tiny_checkpoints["tiny-qwen2"]), **{**CONFIG, **overrides}))


def wait_until(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


async def collect(stream):
    return [out async for out in stream]


@pytest.fixture(scope="module")
def client(tiny_checkpoints):
    c = start(tiny_checkpoints)
    yield c
    c.shutdown(timeout=0)


def idle(client) -> bool:
    stats = client.get_stats()
    return stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0


def test_streams_are_those_of_the_engine_in_process(client, tiny_checkpoints):
    params = {**GREEDY, "logprobs": True}
    with LLM(str(tiny_checkpoints["tiny-qwen2"]), **CONFIG) as llm:
        expected = llm.generate(PROMPTS, [llm.engine.processor.process("p", p, params).sampling_params
                                          for p in PROMPTS])

    async def main():
        streams = [client.add_request(f"same{i}", p, params) for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*(collect(s) for s in streams))

    for outs, reference in zip(asyncio.run(main()), expected):
        last = outs[-1]
        assert last.finish_reason == "length" and last.text == reference.text
        assert last.token_ids == reference.token_ids and last.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
        assert "".join(o.delta_text for o in outs) == last.text
        assert sum(len(o.delta_token_ids) for o in outs) == GREEDY["max_tokens"]
        assert last.prompt_token_ids == reference.prompt_token_ids and last.prompt == reference.prompt
        stats = last.stats
        assert stats.num_generated_tokens == GREEDY["max_tokens"] and len(stats.inter_token_latencies) == 15
        assert 0 < stats.time_to_first_token and stats.finished_time >= stats.token_times[-1]
    assert wait_until(lambda: idle(client))
    assert client.get_stats().num_generation_tokens >= 3 * GREEDY["max_tokens"]


def test_the_stop_reason_comes_from_the_engine_process(client):
    """vLLM's stop_reason crosses the process boundary: the stop string (kept in the text with
    include_stop_str_in_output), the stop token's id, None at max_tokens."""
    async def last(rid, **params):
        return (await collect(client.add_request(rid, PROMPTS[0], {**GREEDY, **params})))[-1]

    async def main():
        ref = await last("ref")
        stop = ref.text[4:7]
        return ref, stop, await last("string", stop=[stop]), await last(
            "kept", stop=[stop], include_stop_str_in_output=True), await last(
            "token", stop_token_ids=[ref.token_ids[2]])

    ref, stop, string, kept, token = asyncio.run(main())
    assert ref.finish_reason == "length" and ref.stop_reason is None
    at = ref.text.index(stop)
    assert (string.text, string.stop_reason) == (ref.text[:at], stop)
    assert (kept.text, kept.stop_reason) == (ref.text[:at + len(stop)], stop)
    assert token.finish_reason == "stop" and token.stop_reason == ref.token_ids[2]


def test_bad_input_and_overload_raise_in_add_request(client):
    async def main():
        with pytest.raises(ValueError, match="top_p must be in"):
            client.add_request("bad", "a", {"top_p": 2})
        with pytest.raises(ValueError, match="prompt must not be empty"):
            client.add_request("empty", "")
        with pytest.raises(ValueError, match="max_tokens must be <="):
            client.add_request("long", "a", {"max_tokens": 1000})
        running = []
        for i in range(4):  # max_num_seqs=4
            running.append(client.add_request(f"running{i}", "a", LONG))
            await running[-1].__anext__()
        # Three wait (max_waiting=3), whether or not the engine has seen them yet: the front end counts.
        queued = [client.add_request(f"queued{i}", "a", LONG) for i in range(3)]
        with pytest.raises(EngineOverloadedError, match=r"waiting queue is full \(max_waiting=3\); retry later"):
            client.add_request("one more", "a", LONG)
        with pytest.raises(ValueError, match="already in use"):
            client.add_request("queued0", "a", LONG)
        for i in range(4):
            client.abort(f"running{i}")
            client.abort(f"queued{i}")
        return [await collect(stream) for stream in running + queued]

    for outs in asyncio.run(main()):
        assert outs[-1].finish_reason == "abort"
    assert wait_until(lambda: idle(client))


def test_abort_and_a_consumer_leaving_early_free_the_sequence(client):
    async def main():
        outs = []
        async for out in client.add_request("aborted", PROMPTS[0], LONG):
            outs.append(out)
            if len(outs) == 3:
                client.abort("aborted")
        async for _ in client.add_request("left", PROMPTS[1], LONG):
            break
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finish_reason == "abort" and len(outs[-1].token_ids) < LONG["max_tokens"]
    assert wait_until(lambda: idle(client))


def test_shutdown_aborts_what_is_left_and_the_process_exits(tiny_checkpoints):
    client = start(tiny_checkpoints)

    async def main():
        stream = client.add_request("r", PROMPTS[0], LONG)
        await asyncio.to_thread(client.shutdown, 0)
        outs = await collect(stream)
        with pytest.raises(EngineClosedError):
            client.add_request("late", "a")
        return outs

    assert asyncio.run(main())[-1].finish_reason == "abort"
    assert not is_alive(client.pid)


def test_a_killed_engine_process_ends_open_streams_and_refuses_new_requests(tiny_checkpoints):
    client = start(tiny_checkpoints)

    async def main():
        stream = client.add_request("r", PROMPTS[0], LONG)
        await stream.__anext__()
        os.kill(client.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match=r"was killed by SIGKILL; its last output"):
            await collect(stream)
        with pytest.raises(EngineDeadError, match="was killed by SIGKILL") as refused:
            client.add_request("after", "a")
        assert isinstance(refused.value, EngineClosedError)  # the backend answers UNAVAILABLE

    try:
        asyncio.run(main())
        assert idle(client)
    finally:
        client.shutdown(timeout=5)


def test_a_failed_start_quotes_the_engine_process_output(tiny_checkpoints, monkeypatch):
    monkeypatch.setenv("LLM_ENGINE_KERNELS", "bogus")  # read when the engine process imports the engine
    with pytest.raises(EngineStartError, match=r"(?s)exited with code 1 while starting.*Traceback.*"
                                               r"LLM_ENGINE_KERNELS must be"):
        start(tiny_checkpoints)


FRONT_END = """
import sys, time
from llm_engine import EngineConfig
from llm_engine.engine.process_client import EngineProcessClient
client = EngineProcessClient(EngineConfig(model=sys.argv[1], device="cpu", max_model_len=64))
print(client.pid, flush=True)
time.sleep(600)
"""


def test_the_engine_process_exits_when_the_front_end_is_killed(tiny_checkpoints):
    front = subprocess.Popen([sys.executable, "-c", FRONT_END, str(tiny_checkpoints["tiny-qwen2"])],
                             stdout=subprocess.PIPE, text=True)
    try:
        pid = int(front.stdout.readline())
        assert is_alive(pid)
    finally:
        front.kill()
        front.wait()
    assert wait_until(lambda: not is_alive(pid))
