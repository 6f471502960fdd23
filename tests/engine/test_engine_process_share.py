"""One engine process shared by several EngineProcessClients (engine_share.py), as the llm's instances
share it (the tiny Qwen2 checkpoint on the CPU): the clients after the first join the engine the first
started, each gets its own requests' outputs (the same as one client alone), an id in use fails only the
request that reuses it, one client's aborts, shutdown and death end only its requests, the engine names
one exporter of its metrics, passes a client's notes to the others, takes no more clients than it was told (a later client starts another),
and exits when its last client has left; every client sees its death."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)

from llm_engine import LLM, EngineConfig
from llm_engine.engine.engine_share import EngineShare
from llm_engine.engine.process_client import EngineProcessClient
from llm_engine.errors import EngineDeadError
from ragstack.process_tree import is_alive

pytestmark = pytest.mark.slow  # starts processes: not in `make test-fast`

CONFIG = dict(device="cpu", max_model_len=128, max_num_seqs=8)
GREEDY = dict(temperature=0.0, max_tokens=12, ignore_eos=True)
LONG = dict(temperature=0.0, max_tokens=110, ignore_eos=True)
PROMPTS = ["The capital of France is", "Two plus two", "Retrieval augmented generation", "A KV cache"]
NOTES: list[list] = [[], [], []]   # what each of `three` was sent by the others (send_note)


def config(tiny_checkpoints) -> EngineConfig:
    return EngineConfig(model=str(tiny_checkpoints["tiny-qwen2"]), **CONFIG)


def share(tmp_path, name: str, max_clients: int) -> EngineShare:
    return EngineShare.named({"test": name}, max_clients, ("--model", f"{name}/1"), directory=tmp_path)


def wait_until(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


async def collect(stream):
    return [out async for out in stream]


async def generate(client, request_id: str, params=GREEDY):
    return await collect(client.add_request(request_id, PROMPTS[1], params))


def idle(client) -> bool:
    stats = client.get_stats()
    return stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0


@pytest.fixture(scope="module")
def three(tiny_checkpoints, tmp_path_factory):
    """Three clients of one engine that takes four."""
    where = share(tmp_path_factory.mktemp("run"), "three", 4)
    clients = [EngineProcessClient(config(tiny_checkpoints), share=where, on_note=NOTES[i].append) for i in range(3)]
    yield clients
    for client in clients:
        client.shutdown(timeout=0)


def test_later_clients_join_the_first_ones_engine_and_get_its_outputs(three, tiny_checkpoints):
    first, second, third = three
    assert first.started_engine and not second.started_engine and not third.started_engine
    assert first.pid == second.pid == third.pid
    assert first.share.socket_path.exists()
    prompts = PROMPTS * 3
    with LLM(str(tiny_checkpoints["tiny-qwen2"]), **CONFIG) as llm:  # the engine alone, for reference
        reference = llm.generate(prompts, [llm.engine.processor.process("p", p, GREEDY).sampling_params
                                           for p in prompts])

    async def streams(clients):
        return await asyncio.gather(*(collect(c.add_request(f"r{i}", p, GREEDY))
                                      for i, (c, p) in enumerate(zip(clients, prompts))))

    for outs, ref in zip(asyncio.run(streams([first, second, third] * 4)), reference):
        assert outs[-1].finish_reason == "length" and outs[-1].token_ids == ref.token_ids
        assert "".join(o.delta_text for o in outs) == ref.text
    assert wait_until(lambda: all(idle(c) for c in three))


def test_a_request_id_in_use_fails_only_the_request_that_reuses_it(three):
    first, second, _ = three

    async def main():
        running = first.add_request("same-id", PROMPTS[0], LONG)
        await running.__anext__()
        with pytest.raises(Exception, match="already in use"):
            await collect(second.add_request("same-id", PROMPTS[1], GREEDY))
        first.abort("same-id")
        return await collect(running)

    assert asyncio.run(main())[-1].finish_reason == "abort"
    assert wait_until(lambda: idle(first))


def test_one_clients_abort_and_shutdown_end_only_its_requests(three, tiny_checkpoints):
    first, second, _ = three

    async def main():
        mine = [first.add_request(f"keep{i}", PROMPTS[i], LONG) for i in range(2)]
        theirs = [second.add_request(f"drop{i}", PROMPTS[i], LONG) for i in range(2)]
        for stream in mine + theirs:
            await stream.__anext__()
        second.abort("drop0")
        dropped = await collect(theirs[0])
        kept = await asyncio.gather(*(collect(s) for s in mine))
        return dropped, kept, await collect(theirs[1])

    dropped, kept, other = asyncio.run(main())
    assert dropped[-1].finish_reason == "abort"
    assert all(outs[-1].finish_reason == "length" for outs in kept) and other[-1].finish_reason == "length"

    # A fourth client joins, starts a long request and shuts down at once: its request is aborted, the
    # others' runs on.
    fourth = EngineProcessClient(config(tiny_checkpoints), share=first.share)
    assert fourth.pid == first.pid

    async def shutdown_with_requests_open():
        theirs = fourth.add_request("cut", PROMPTS[0], LONG)
        mine = first.add_request("goes on", PROMPTS[1], LONG)
        await theirs.__anext__()
        await mine.__anext__()
        await asyncio.to_thread(fourth.shutdown, 0)
        return await collect(theirs), await collect(mine)

    theirs, mine = asyncio.run(shutdown_with_requests_open())
    assert theirs[-1].finish_reason == "abort" and mine[-1].finish_reason == "length"
    assert is_alive(first.pid) and wait_until(lambda: idle(first))


def test_the_oldest_client_exports_the_engine_metrics(three):
    first, second, third = three
    assert wait_until(lambda: first.exporter and not second.exporter and not third.exporter, 5)


def test_a_note_reaches_the_engines_other_clients_not_its_sender(three):
    first, second, third = three
    first.send_note(("abort-key", "k1"))
    third.send_note({"any": "picklable"})
    assert wait_until(lambda: len(NOTES[1]) == 2 and len(NOTES[0]) == 1 and len(NOTES[2]) == 1, 5)
    assert NOTES[0] == [{"any": "picklable"}] and NOTES[2] == [("abort-key", "k1")]
    # the two senders' inbox threads relay independently: either may reach the middle client first
    assert sorted(map(repr, NOTES[1])) == sorted(map(repr, [("abort-key", "k1"), {"any": "picklable"}]))


FRONT_END = """
import asyncio, sys
from pathlib import Path
from llm_engine import LLM, EngineConfig
from llm_engine.engine.engine_share import EngineShare
from llm_engine.engine.process_client import EngineProcessClient
share = EngineShare(sys.argv[2], 3, directory=Path(sys.argv[3]))
client = EngineProcessClient(EngineConfig(model=sys.argv[1], device="cpu", max_model_len=128, max_num_seqs=8),
                             share=share)
async def main():
    async for out in client.add_request("theirs", "a long one", {"temperature": 0, "max_tokens": 110,
                                                                "ignore_eos": True}):
        print(client.pid, flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


def test_a_client_that_dies_takes_only_its_requests_a_full_engine_refuses_more_and_all_see_its_death(
        tiny_checkpoints, tmp_path):
    where = share(tmp_path, "dies", 3)
    first = EngineProcessClient(config(tiny_checkpoints), share=where)
    front = subprocess.Popen([sys.executable, "-c", FRONT_END, str(tiny_checkpoints["tiny-qwen2"]), where.key,
                              str(tmp_path)], stdout=subprocess.PIPE, text=True)
    third = fourth = None
    try:
        assert int(front.stdout.readline()) == first.pid  # it joined, and its request runs

        async def a_client_dies():
            stream = first.add_request("mine", PROMPTS[0], LONG)
            await stream.__anext__()
            assert first.get_stats().num_running == 2
            front.kill()
            front.wait()
            seen = []   # (running, waiting, preemptions) reported meanwhile, should it fail again (CI at 724a480)
            assert await asyncio.to_thread(wait_until, lambda: seen.append(first.get_stats()) or
                                           seen[-1].num_running == 1), sorted(
                {(s.num_running, s.num_waiting, s.num_preemptions) for s in seen})
            return await collect(stream)

        assert asyncio.run(a_client_dies())[-1].finish_reason == "length"
        # It took 2 of its 3 clients: one more joins, the fourth starts an engine of its own.
        third = EngineProcessClient(config(tiny_checkpoints), share=where)
        fourth = EngineProcessClient(config(tiny_checkpoints), share=where)
        assert third.pid == first.pid and fourth.started_engine and fourth.pid != first.pid
        fourth.shutdown(timeout=0)  # its last client: it exits, the first engine serves on
        assert wait_until(lambda: not is_alive(fourth.pid)) and is_alive(first.pid)

        async def the_engine_dies():
            streams = [first.add_request("a", PROMPTS[0], LONG), third.add_request("b", PROMPTS[1], LONG)]
            for stream in streams:
                await stream.__anext__()
            os.kill(first.pid, signal.SIGKILL)
            for stream, how in zip(streams, ("was killed by SIGKILL", "closed its connection")):
                with pytest.raises(EngineDeadError, match=rf"the engine process \(pid {first.pid}\) {how}"):
                    await collect(stream)

        asyncio.run(the_engine_dies())
        assert first.failure and third.failure and not first.exporter
    finally:
        front.kill()
        for client in (first, third, fourth):
            if client is not None:
                client.shutdown(timeout=0)
    assert not is_alive(first.pid)


def test_the_last_client_leaving_ends_the_engine(three, tiny_checkpoints):
    pid, share = three[0].pid, three[0].share
    for client in three:
        client.shutdown(timeout=0)
    assert wait_until(lambda: not is_alive(pid)) and not share.log_path.exists()
    with pytest.raises(ConnectionRefusedError):  # nothing listens there: the next client starts an engine
        socket.socket(socket.AF_UNIX).connect(str(share.socket_path))
