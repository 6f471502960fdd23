"""LLMEngine / LLM: engine logic on a deterministic fake model, then real tiny models on the CPU."""
from __future__ import annotations

import pytest

from llm_engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0)


def drain(engine, max_steps=500):
    """Step until idle; every output per request, in order."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine did not finish")


def final(outputs, rid):
    out = outputs[rid][-1]
    assert out.finished
    return out


# --- engine logic on the counting fake model (see conftest.CountingRunner) --------------------

def test_greedy_generation_and_streamed_deltas(fake_engine):
    engine = fake_engine()
    engine.add_request("r", "ab", SamplingParams(max_tokens=5, **GREEDY))
    outs = drain(engine)["r"]
    last = outs[-1]
    assert last.text == "cdefg" and last.finish_reason == "length"
    assert last.token_ids == [ord(c) for c in "cdefg"]
    assert "".join(o.delta_text for o in outs) == last.text
    assert sum((o.delta_token_ids for o in outs), []) == last.token_ids
    assert all(not o.finished for o in outs[:-1])
    assert last.prompt == "ab" and last.prompt_token_ids == [ord("a"), ord("b")]


def test_eos_stops_unless_ignored(fake_engine):
    engine = fake_engine()
    engine.add_request("stop", "x", SamplingParams(max_tokens=8, **GREEDY))
    engine.add_request("ignore", "x", SamplingParams(max_tokens=4, ignore_eos=True, **GREEDY))
    outs = drain(engine)
    stop, ignore = final(outs, "stop"), final(outs, "ignore")
    assert stop.finish_reason == "stop" and stop.text == "yz" and stop.token_ids[-1] == 256
    assert ignore.finish_reason == "length" and len(ignore.token_ids) == 4


def test_stop_strings_truncate_the_text(fake_engine):
    engine = fake_engine()
    engine.add_request("s", "a", SamplingParams(max_tokens=10, stop=["fg", "zz"], **GREEDY))
    engine.add_request("late", "a", SamplingParams(max_tokens=5, stop=["c"], min_tokens=3, **GREEDY))
    engine.add_request("ids", "a", SamplingParams(max_tokens=10, stop_token_ids=[ord("e")], **GREEDY))
    outs = drain(engine)
    s = final(outs, "s")
    assert s.finish_reason == "stop" and s.text == "bcde"
    assert "".join(o.delta_text for o in outs["s"]) == "bcde"
    assert s.token_ids == [ord(c) for c in "bcdefg"]  # generation stops at the token completing it
    late = final(outs, "late")  # "c" came before min_tokens: not a stop
    assert late.finish_reason == "length" and late.text == "bcdef"
    ids = final(outs, "ids")  # a stop token ends the output without its own text
    assert ids.finish_reason == "stop" and ids.text == "bcd" and ids.token_ids[-1] == ord("e")


def test_stop_string_on_the_last_allowed_token_reports_stop(fake_engine):
    engine = fake_engine()
    engine.add_request("s", "a", SamplingParams(max_tokens=3, stop=["d"], **GREEDY))
    out = final(drain(engine), "s")
    assert out.finish_reason == "stop" and out.text == "bc"


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=""), "prompt must not be empty"),
    (dict(prompt=[]), "prompt must not be empty"),
    (dict(prompt=None), "prompt (text or token ids) or prompt_token_ids is required"),
    (dict(prompt="a" * 40), "prompt has 40 tokens; it must be shorter than max_model_len=40"),
    (dict(prompt="a" * 30, sampling_params=SamplingParams(max_tokens=20)),
     "max_tokens must be <= 10 (max_model_len=40 minus 30 prompt tokens), got 20"),
    (dict(prompt="a", sampling_params={"top_p": 1.5}), "top_p must be in (0, 1], got 1.5"),
    (dict(prompt="a", sampling_params={"nucleus": 0.5}), "unknown sampling parameter(s) ['nucleus']"),
    (dict(prompt=[1, 999]), "prompt token ids must be in [0, 260), got min 1, max 999"),
    (dict(prompt="a", sampling_params={"stop_token_ids": [300]}), "stop_token_ids must be < vocab size 260"),
])
def test_bad_requests_raise_value_error_and_the_engine_serves_on(fake_engine, kwargs, message):
    engine = fake_engine(max_model_len=40)
    engine.add_request("ok-1", "a", SamplingParams(max_tokens=3, **GREEDY))
    with pytest.raises(ValueError) as err:
        engine.add_request("bad", **kwargs)
    assert message in str(err.value)
    engine.add_request("ok-2", "b", SamplingParams(max_tokens=3, **GREEDY))
    outs = drain(engine)
    assert final(outs, "ok-1").text == "bcd" and final(outs, "ok-2").text == "cde"
    assert "bad" not in outs


def test_duplicate_request_ids_are_rejected(fake_engine):
    engine = fake_engine()
    engine.add_request("r", "a")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("r", "b")


def test_max_tokens_none_fills_the_context(fake_engine):
    engine = fake_engine(max_model_len=12)
    engine.add_request("r", "a" * 4, SamplingParams(max_tokens=None, ignore_eos=True, **GREEDY))
    assert len(final(drain(engine), "r").token_ids) == 8


def test_abort_frees_every_block_and_reports_abort(fake_engine):
    engine = fake_engine(max_num_batched_tokens=8)
    engine.add_request("decoding", "abc", SamplingParams(max_tokens=50, **GREEDY))
    engine.add_request("prefilling", "p" * 30, SamplingParams(max_tokens=50, **GREEDY))
    engine.add_request("waiting", "w", SamplingParams(max_tokens=50, **GREEDY))
    engine.step()
    engine.step()
    assert engine.get_stats().kv_blocks_used > 0
    outs = [engine.abort_request(rid) for rid in ("decoding", "prefilling", "waiting")]
    assert [o.finish_reason for o in outs] == ["abort"] * 3
    assert engine.abort_request("decoding") is None
    stats = engine.get_stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_chunked_prefill_keeps_decodes_going(fake_engine):
    engine = fake_engine(max_num_batched_tokens=8)
    engine.add_request("short", "ab", SamplingParams(max_tokens=10, ignore_eos=True, **GREEDY))
    engine.step()
    engine.add_request("long", "q" * 40, SamplingParams(max_tokens=2, ignore_eos=True, **GREEDY))
    outs = drain(engine)
    batches = engine.model_runner.batches
    assert all(sum(n for _, n, _ in b) <= 8 for b in batches)
    prefill_steps = [b for b in batches if any(rid == "long" and n > 1 for rid, n, _ in b)]
    assert len(prefill_steps) >= 5
    assert all(b[0][:2] == ("short", 1) for b in prefill_steps)  # the decode never waits
    assert final(outs, "short").text == "cdefghijkl"


def test_preemption_under_a_tiny_kv_pool_completes_every_request(fake_engine):
    def run(num_kv_blocks):
        engine = fake_engine(num_kv_blocks=num_kv_blocks, max_num_batched_tokens=16)
        for i in range(6):
            engine.add_request(f"r{i}", chr(ord("a") + i) * (3 + i),
                               SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY))
        outs = drain(engine, max_steps=2000)
        return engine, {rid: final(outs, rid).token_ids for rid in outs}

    roomy, expected = run(64)
    tight, got = run(8)
    assert roomy.get_stats().num_preemptions == 0
    assert tight.get_stats().num_preemptions > 0
    assert got == expected
    assert tight.get_stats().kv_blocks_used == 0


def test_a_failed_batch_fails_its_requests_and_the_engine_serves_on(fake_engine):
    engine = fake_engine()
    engine.model_runner.fail_when = lambda batch: any(s.request_id == "poison" for s in batch.seqs)
    engine.add_request("poison", "a", SamplingParams(max_tokens=3, **GREEDY))
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("poison", "error")]
    assert "injected model failure" in outs[0].error
    assert engine.get_stats().kv_blocks_used == 0
    engine.add_request("next", "a", SamplingParams(max_tokens=3, **GREEDY))
    assert final(drain(engine), "next").text == "bcd"


def test_a_post_processing_failure_fails_only_its_request(fake_engine, monkeypatch):
    engine = fake_engine()
    engine.add_request("good", "a", SamplingParams(max_tokens=4, **GREEDY))
    engine.add_request("bad", "a", SamplingParams(max_tokens=4, **GREEDY))
    bad = engine._requests["bad"].detokenizer

    def broken(*args, **kwargs):
        raise UnicodeError("broken tokenizer")
    monkeypatch.setattr(bad, "add_token", broken)
    outs = drain(engine)
    assert final(outs, "bad").finish_reason == "error" and "broken tokenizer" in final(outs, "bad").error
    assert final(outs, "good").text == "bcde"


def test_request_and_engine_stats(fake_engine):
    engine = fake_engine()
    engine.add_request("a", "abcdefghij", SamplingParams(max_tokens=4, **GREEDY))
    first = final(drain(engine), "a")
    engine.add_request("b", "abcdefghijk", SamplingParams(max_tokens=3, logprobs=True, **GREEDY))
    out = final(drain(engine), "b")
    st = out.stats
    assert st.num_prompt_tokens == 11 and st.num_generated_tokens == 3 and st.num_cached_tokens == 8
    assert 0 <= st.queue_time <= st.time_to_first_token
    assert len(st.inter_token_latencies) == 2 and st.finished_time >= st.token_times[-1]
    assert len(out.logprobs) == 3 and all(lp <= 0 for lp in out.logprobs)
    assert first.logprobs is None
    es = engine.get_stats()
    assert es.num_generation_tokens == 7 and es.num_cached_tokens == 8
    assert es.num_prompt_tokens == 10 + 3  # b's cached 8 tokens were not computed
    assert es.kv_blocks_total == 64 and es.kv_blocks_used + es.kv_blocks_free == 64
