"""Async scheduling (a step launched before the previous one's tokens reach the host): outputs
identical to the synchronous engine's, on the counting fake model and on tiny real checkpoints;
the async path taken in the steady state; placeholders filled on the device; no stream sync in the
step loop (on a GPU)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM
from llm_engine.config import EngineConfig
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence, placeholder_token
from llm_engine.sampling_params import SamplingParams
from llm_engine.worker.model_runner import ModelRunner
from llm_engine.worker.sampler import Sampler

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, **kw)


def run(engine, arrivals, aborts=(), max_steps=3000):
    """Feed requests at their step ({step: [(id, prompt, params)]}), abort ids at theirs
    ({step: [id]}); every output per request, in order, as comparable tuples."""
    aborts = dict(aborts)
    streams: dict[str, list] = {}

    def record(out):
        logprobs = None if out.logprobs is None else [round(lp, 4) for lp in out.logprobs]
        streams.setdefault(out.request_id, []).append(
            (out.delta_text, tuple(out.delta_token_ids), tuple(out.token_ids), out.text, out.finish_reason,
             out.error, logprobs))

    for step in range(max_steps):
        if step > max(arrivals) and step > max(aborts, default=0) and not engine.has_unfinished_requests():
            return streams
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
        for rid in aborts.get(step, []):
            out = engine.abort_request(rid)
            if out is not None:
                record(out)
        for out in engine.step():
            record(out)
    raise AssertionError("engine did not finish")


# --- the counting fake model (conftest.CountingRunner: "a" continues "bcd...", "x" ends after "yz") -------

FAKE_SCENARIOS = {
    "staggered, eos, max_tokens, stops": {
        0: [("eos", "x", greedy(max_tokens=8)), ("len", "ab", greedy(max_tokens=5))],
        1: [("stop-str", "a", greedy(max_tokens=10, stop=["fg"]))],
        3: [("stop-id", "a", greedy(max_tokens=10, stop_token_ids=[ord("e")])),
            ("min", "a", greedy(max_tokens=5, stop=["c"], min_tokens=3))],
        4: [("eos-late", "v", greedy(max_tokens=10)), ("ignore", "x", greedy(max_tokens=4, ignore_eos=True))],
        # eos / a stop token as the last allowed token: "stop", though the length limit ended it first
        6: [("eos-last", "x", greedy(max_tokens=3)), ("stop-id-last", "a", greedy(max_tokens=2, stop_token_ids=[99]))],
    },
    "mixed penalties and logprobs": {
        0: [("g", "a", greedy(max_tokens=9)), ("pen", "b", greedy(max_tokens=9, repetition_penalty=1.3))],
        2: [("lp", "c", greedy(max_tokens=6, logprobs=True)), ("eos", "w", greedy(max_tokens=9))],
        5: [("freq", "d", greedy(max_tokens=4, frequency_penalty=0.5, presence_penalty=0.2))],
    },
}


@pytest.mark.parametrize("scenario", FAKE_SCENARIOS, ids=str)
def test_fake_model_outputs_are_identical_with_async_scheduling_on_and_off(fake_engine, scenario):
    arrivals = FAKE_SCENARIOS[scenario]
    sync = run(fake_engine(async_scheduling=False), arrivals)
    engine = fake_engine()
    assert run(engine, arrivals) == sync
    assert engine.get_stats().num_async_steps > 0 and engine.get_stats().kv_blocks_used == 0
    for rid, streams in sync.items():
        assert streams[-1][4] == ("length" if rid in ("len", "min", "ignore", "g", "pen", "lp", "freq") else "stop"), rid


def test_fake_model_aborts_mid_stream_match_and_free_every_block(fake_engine):
    arrivals = {0: [(f"r{i}", chr(ord("a") + i), greedy(max_tokens=30, ignore_eos=True)) for i in range(4)]}
    aborts = {3: ["r1"], 6: ["r0", "r3"], 7: ["r0"]}  # r0 twice: the second is a no-op
    sync = run(fake_engine(async_scheduling=False), arrivals, aborts)
    engine = fake_engine()
    streams = run(engine, arrivals, aborts)
    assert streams == sync
    assert [streams[r][-1][4] for r in ("r0", "r1", "r2", "r3")] == ["abort", "abort", "length", "abort"]
    assert len(streams["r1"][-1][2]) == 2  # two steps' tokens were out; the one in flight was dropped
    assert engine.get_stats().kv_blocks_used == 0


def test_fake_model_preemption_under_a_tiny_pool_keeps_outputs(fake_engine):
    arrivals = {0: [(f"r{i}", chr(ord("a") + i) * (3 + i), greedy(max_tokens=12, ignore_eos=True)) for i in range(6)]}
    sync = run(fake_engine(num_kv_blocks=64, async_scheduling=False, max_num_batched_tokens=16), arrivals)
    engine = fake_engine(num_kv_blocks=8, max_num_batched_tokens=16)
    assert run(engine, arrivals) == sync
    stats = engine.get_stats()
    assert stats.num_preemptions > 0 and stats.num_async_steps > 0 and stats.kv_blocks_used == 0


def test_a_failed_async_step_still_delivers_the_previous_tokens(fake_engine):
    engine = fake_engine()
    engine.add_request("r", "a", greedy(max_tokens=10))
    engine.step()  # the prefill, in flight
    engine.model_runner.fail_when = lambda batch: True
    outs = engine.step()  # launching the next step fails after the prefill's token was advanced
    assert [(o.delta_text, o.finish_reason) for o in outs] == [("b", None), ("", "error")]
    assert engine.get_stats().kv_blocks_used == 0 and not engine.has_unfinished_requests()


def count_async_steps(engine, requests) -> int:
    run(engine, {0: requests})
    return engine.get_stats().num_async_steps


def test_the_greedy_steady_state_takes_the_async_path(fake_engine):
    # One step per token; each launched before the last one's token is on the host, but the
    # first (nothing is in flight) and the one after the last token (nothing left to launch).
    assert count_async_steps(fake_engine(), [("r", "a", greedy(max_tokens=12))]) == 11
    sampled = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=3, max_tokens=12)
    assert count_async_steps(fake_engine(), [("r", "a", sampled)]) == 11
    assert count_async_steps(fake_engine(), [("r", "a", greedy(max_tokens=12, logprobs=True))]) == 11
    penalised = greedy(max_tokens=12, repetition_penalty=1.2, frequency_penalty=0.3)
    assert count_async_steps(fake_engine(), [("r", "a", penalised)]) == 11
    assert count_async_steps(fake_engine(async_scheduling=False), [("r", "a", greedy(max_tokens=12))]) == 0


def test_the_step_in_flight_sees_placeholders_of_the_sampled_rows(fake_engine):
    engine = fake_engine()
    for rid in "ab":
        engine.add_request(rid, rid * 3, greedy(max_tokens=5))
    engine.step()
    seen = []
    real = engine.model_runner.execute

    def spy(batch, sampled_ids=None):
        seen.append(([s.token_ids[-1] for s in batch.seqs], sampled_ids.tolist()))
        return real(batch, sampled_ids)
    engine.model_runner.execute = spy
    engine.step()
    assert seen == [([placeholder_token(0), placeholder_token(1)], [ord("b"), ord("c")])]
    assert [engine._requests[r].seq.token_ids[-1] for r in "ab"] == [ord("b"), ord("c")]  # resolved after


# --- tiny real checkpoints on the CPU ----------------------------------------------------------------------

PROMPTS = ["The quick brown fox", "Retrieval augmented generation combines a search engine with a language model",
           "A", "Each request is split into tokens, and"]


@pytest.fixture(scope="module")
def llms(tiny_checkpoints):
    """(name, async_scheduling) -> an LLM on the CPU, built once per module."""
    made = {}

    def get(name: str, async_scheduling: bool, **config) -> LLM:
        key = (name, async_scheduling, tuple(sorted(config.items())))
        if key not in made:
            made[key] = LLM(str(tiny_checkpoints[name]), device="cpu", max_model_len=256, max_num_batched_tokens=32,
                            async_scheduling=async_scheduling, **config)
        return made[key]

    return get


def real_scenario(llm: LLM) -> dict:
    """Staggered lengths and arrivals; a stop token from the greedy output standing in for eos in
    the middle, a stop string, max_tokens, penalties, logprobs and a seeded sampled request."""
    ref = llm.generate([PROMPTS[0]], greedy(max_tokens=16, ignore_eos=True))[0]
    return {
        0: [("long", PROMPTS[1], greedy(max_tokens=14, ignore_eos=True)),
            ("stop-id", PROMPTS[0], greedy(max_tokens=16, ignore_eos=True, stop_token_ids=[ref.token_ids[5]]))],
        1: [("stop-str", PROMPTS[0], greedy(max_tokens=16, ignore_eos=True, stop=[ref.text[8:11]]))],
        3: [("short", PROMPTS[2], greedy(max_tokens=3, ignore_eos=True)),
            ("lp", PROMPTS[3], greedy(max_tokens=9, ignore_eos=True, logprobs=True))],
        4: [("pen", PROMPTS[3], greedy(max_tokens=8, ignore_eos=True, repetition_penalty=1.5)),
            ("seeded", PROMPTS[2], SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=7, max_tokens=10,
                                                  ignore_eos=True))],
        9: [("late", PROMPTS[1] + " again", greedy(max_tokens=6, ignore_eos=True))],
    }


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_real_model_outputs_are_identical_with_async_scheduling_on_and_off(llms, name):
    sync_llm, async_llm = llms(name, False), llms(name, True)
    arrivals = real_scenario(sync_llm)
    assert real_scenario(async_llm) == arrivals
    aborts = {6: ["long"]}
    sync = run(sync_llm.engine, arrivals, aborts)
    before = async_llm.engine.get_stats().num_async_steps
    got = run(async_llm.engine, arrivals, aborts)
    assert got == sync
    assert got["stop-id"][-1][4] == "stop" and got["stop-str"][-1][4] == "stop" and got["long"][-1][4] == "abort"
    assert async_llm.engine.get_stats().num_async_steps > before
    assert async_llm.engine.get_stats().kv_blocks_used == 0


def test_real_model_preemption_under_a_small_pool_matches(llms):
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 2)]
    params = greedy(max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in llms("tiny-llama", False).generate(prompts, params)]
    llm = llms("tiny-llama", True, num_kv_blocks=10, block_size=16)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.num_async_steps > 0 and stats.kv_blocks_used == 0


# --- the runner and the sampler ----------------------------------------------------------------------------

def runner_for(folder, **config) -> ModelRunner:
    return ModelRunner(EngineConfig(model=str(folder), **{"device": "cpu", "max_model_len": 256, **config}))


def prefilled(runner, prompts):
    """Sequences whose prompts are in the KV cache, each with one more (real) token to decode."""
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(token_ids=list(prompt), sampling_params=None)
        seq.block_table = list(range(4 * i, 4 * i + 4))
        seqs.append(seq)
    runner.execute(ScheduledBatch(seqs, [len(s) for s in seqs], [True] * len(seqs)))
    for seq, token in zip(seqs, (11, 12, 13)):
        seq.num_computed_tokens = len(seq)
        seq.append_token(token)
    return seqs


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffer"])
def test_placeholders_are_filled_from_the_sampled_ids_on_the_device(tiny_checkpoints, graphs):
    runner = runner_for(tiny_checkpoints["tiny-llama"], num_kv_blocks=16, block_size=4, max_num_seqs=4)
    if graphs:  # the CUDA-graph path (static input buffer) with each graph's body run eagerly
        runner.decode_graphs = runner.new_decode_graphs()
        runner.decode_graphs.graphs = {bs: SimpleNamespace(replay=runner.decode_graphs.body(bs)) for bs in (1, 2, 4)}
    seqs = prefilled(runner, [range(5, 12), range(20, 26), range(30, 33)])
    batch = ScheduledBatch(seqs, [1, 1, 1], [True, True, True])
    before = runner.kv_cache.kv.clone()
    expected = runner.execute(batch)
    runner.kv_cache.kv.copy_(before)
    # Rows 0 and 2 stand for the sampled ids' rows 1 and 0; row 1 keeps its real token.
    sampled_ids = torch.tensor([13, 11, 99], dtype=torch.int32)
    seqs[0].token_ids[-1], seqs[2].token_ids[-1] = placeholder_token(1), placeholder_token(0)
    host, layout = runner.prepare_step(batch, graphs=True)
    assert layout.num_placeholders == 2 and bool(layout.graph_rows) == graphs
    torch.testing.assert_close(runner.execute(batch, sampled_ids), expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="2 placeholder tokens but no sampled ids"):
        runner.execute(batch)


def test_penalties_read_a_placeholder_from_the_sampled_ids():
    def seq(last):
        s = Sequence(token_ids=[1, 2], sampling_params=SamplingParams(temperature=0, repetition_penalty=3.0,
                                                                      frequency_penalty=1.0, presence_penalty=0.5))
        for t in (5, last):
            s.append_token(t)
        return s
    logits = torch.randn(2, 32, generator=torch.Generator().manual_seed(1)).abs() + 1
    sampler = Sampler([3])
    real = sampler._apply_penalties(logits.clone(), [seq(7), seq(9)], None)
    sampled_ids = torch.tensor([9, 4, 7], dtype=torch.int32)
    from_device = sampler._apply_penalties(logits.clone(), [seq(placeholder_token(2)), seq(placeholder_token(0))],
                                           sampled_ids)
    torch.testing.assert_close(from_device, real)
    assert not torch.equal(real, logits)


def test_the_sampler_leaves_int32_ids_on_the_device():
    seqs = [Sequence(token_ids=[1, 2], sampling_params=SamplingParams(temperature=t, logprobs=lp, seed=1))
            for t, lp in ((0, False), (0.7, True), (0, True))]
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    out = Sampler([3])(logits, seqs)
    assert out.ids.dtype == torch.int32 and out.ids.tolist() == out.token_ids
    assert out.token_ids[0] == int(logits[0].argmax()) and out.token_ids[2] == int(logits[2].argmax())
    assert out.logprobs[0] is None and out.logprobs[1] < 0 and out.logprobs[2] <= 0


# --- on a GPU: the step loop never waits for the whole stream ----------------------------------------------

@needs_cuda
def test_the_steady_state_step_loop_has_no_stream_sync(tiny_checkpoints):
    llm = LLM(str(tiny_checkpoints["tiny-llama"]), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=8)
    engine = llm.engine
    engine.add_request("greedy", PROMPTS[0], greedy(max_tokens=40, ignore_eos=True))
    engine.add_request("sampled", PROMPTS[1], SamplingParams(temperature=0.8, top_p=0.9, top_k=20, min_p=0.05,
                                                             seed=5, max_tokens=40, ignore_eos=True, logprobs=True))
    for _ in range(4):  # prefill and the first decodes (allocations, first graph replays)
        engine.step()
    before = engine.get_stats().num_async_steps
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(20):
            if i == 10:  # a step with a prefill chunk next to the decodes
                engine.add_request("joins", PROMPTS[3], greedy(max_tokens=8, ignore_eos=True, repetition_penalty=1.2))
            engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.get_stats().num_async_steps - before == 20
    assert engine.model_runner.decode_graphs.graphs  # the decodes replayed CUDA graphs
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.get_stats().kv_blocks_used == 0
