"""LLMEngine / LLM: engine logic on a deterministic fake model, then real tiny models on the CPU."""
from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from engine_steps import drain
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM
from llm_engine.errors import EngineOverloadedError
from llm_engine.sampling_params import SamplingParams

GREEDY = dict(temperature=0)


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


def test_truncate_prompt_tokens_keeps_the_prompts_tail(fake_engine):
    engine = fake_engine(max_model_len=40)
    engine.add_request("tail", "abcdef", SamplingParams(max_tokens=2, truncate_prompt_tokens=2, **GREEDY))
    engine.add_request("whole", "abc", SamplingParams(max_tokens=2, truncate_prompt_tokens=5, **GREEDY))
    with pytest.raises(ValueError, match="prompt has 40 tokens; it must be shorter than max_model_len=40"):
        # -1 keeps max_model_len tokens, as in vLLM: a generation needs one place more
        engine.add_request("model_len", "x" * 60, SamplingParams(max_tokens=1, truncate_prompt_tokens=-1))
    outs = drain(engine)
    tail, whole = final(outs, "tail"), final(outs, "whole")
    assert tail.prompt_token_ids == [ord("e"), ord("f")] and tail.prompt is None and tail.text == "gh"
    assert whole.prompt == "abc" and whole.prompt_token_ids == [ord(c) for c in "abc"]


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


def test_stop_reason_names_the_stop_string_or_stop_token(fake_engine):
    """vLLM's stop_reason: the stop string or the stop_token_ids id that ended the output, None for the
    eos and max_tokens; include_stop_str_in_output keeps the stop string (and a stop token's text)."""
    engine = fake_engine()
    requests = {  # request id: (prompt, params, text, stop_reason)
        "string": ("a", dict(stop=["zz", "ef"]), "bcd", "ef"),
        "string_kept": ("a", dict(stop=["zz", "ef"], include_stop_str_in_output=True), "bcdef", "ef"),
        "token": ("a", dict(stop_token_ids=[ord("e")]), "bcd", ord("e")),
        "token_kept": ("a", dict(stop_token_ids=[ord("e")], include_stop_str_in_output=True), "bcde", ord("e")),
        # the stop token's text, decoded with include_stop_str_in_output, holds a stop string: that is the reason
        "token_string": ("a", dict(stop_token_ids=[ord("e")], stop=["de"], include_stop_str_in_output=True),
                         "bcde", "de"),
        "token_at_max_tokens": ("a", dict(stop_token_ids=[ord("e")], max_tokens=4), "bcd", ord("e")),
        "string_at_max_tokens": ("a", dict(stop=["d"], max_tokens=3), "bc", "d"),
        "eos": ("x", dict(stop=["zz"]), "yz", None),
        "eos_kept": ("x", dict(include_stop_str_in_output=True), "yz", None),   # a special token: no text
        "eos_shown": ("x", dict(include_stop_str_in_output=True, skip_special_tokens=False), "yz</s>", None),
        "length": ("a", dict(stop=["zz"], max_tokens=3), "bcd", None),
        # "c" comes below min_tokens, where stop strings do not apply: "f" ends it
        "min_tokens": ("a", dict(stop=["c", "f"], min_tokens=3), "bcde", "f"),
        "min_tokens_kept": ("a", dict(stop=["c", "f"], min_tokens=3, include_stop_str_in_output=True), "bcdef", "f"),
    }
    for rid, (prompt, params, _, _) in requests.items():
        engine.add_request(rid, prompt, SamplingParams(**{"max_tokens": 10, **params}, **GREEDY))
    outs = drain(engine)
    for rid, (_, _, text, reason) in requests.items():
        last = final(outs, rid)
        assert (last.text, last.stop_reason) == (text, reason), rid
        assert last.finish_reason == ("length" if rid == "length" else "stop"), rid
        assert "".join(o.delta_text for o in outs[rid]) == text, rid
        assert all(o.stop_reason is None for o in outs[rid][:-1]), rid


def test_include_stop_str_in_output_streams_what_could_begin_a_stop_string_at_once(fake_engine):
    engine = fake_engine()
    engine.add_request("held", "a", SamplingParams(max_tokens=10, stop=["def"], **GREEDY))
    engine.add_request("shown", "a", SamplingParams(max_tokens=10, stop=["def"], include_stop_str_in_output=True,
                                                    **GREEDY))
    outs = drain(engine)
    assert [o.text for o in outs["held"]] == ["b", "bc", "bc", "bc", "bc"]
    assert [o.text for o in outs["shown"]] == ["b", "bc", "bcd", "bcde", "bcdef"]


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
    (dict(prompt="a", sampling_params={"logit_bias": {"1": 5, "260": -1}}),
     "logit_bias token ids must be < vocab size 260, got 260"),
    (dict(prompt="a", sampling_params={"allowed_token_ids": [1, 300]}), "allowed_token_ids must be < vocab size 260"),
    (dict(prompt="a", sampling_params={"allowed_token_ids": [7], "stop_token_ids": [7], "min_tokens": 1}),
     "allowed_token_ids holds only end-of-sequence or stop ids, which min_tokens=1 forbids"),
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


FINAL_ONLY_CASES = {  # request id: (prompt, params)
    "eos": ("x", SamplingParams(max_tokens=8, **GREEDY)),
    "length": ("ab", SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY)),
    "multibyte": ("\xc3", SamplingParams(max_tokens=3, ignore_eos=True, **GREEDY)),  # bytes c3 c4 ... split a char
    "stop_string": ("ab", SamplingParams(max_tokens=9, stop=["ef"], **GREEDY)),
    "stop_token": ("ab", SamplingParams(max_tokens=9, stop_token_ids=[ord("e")], **GREEDY)),
}


def test_waiting_queue_is_bounded(fake_engine):
    engine = fake_engine(max_waiting=2)
    engine.add_request("a", "abc")
    engine.add_request("b", "abc")
    with pytest.raises(EngineOverloadedError, match="max_waiting=2"):
        engine.add_request("c", "abc")
    assert engine.request_ids == ["a", "b"]


def test_final_only_requests_report_once_with_the_streamed_result(fake_engine):
    results = {}
    for final_only in (False, True):
        engine = fake_engine()
        for rid, (prompt, params) in FINAL_ONLY_CASES.items():
            engine.add_request(rid, prompt, params, final_only=final_only)
        results[final_only] = drain(engine)
    for rid in FINAL_ONLY_CASES:
        streamed, once = final(results[False], rid), final(results[True], rid)
        assert (once.text, once.token_ids, once.finish_reason, once.stop_reason) == \
            (streamed.text, streamed.token_ids, streamed.finish_reason, streamed.stop_reason), rid
        # Stop strings are checked per token, so those requests still report every token.
        assert len(results[True][rid]) == (len(results[False][rid]) if rid == "stop_string" else 1), rid
        assert once.stats.inter_token_latencies and len(once.stats.token_times) == len(streamed.stats.token_times)


def test_an_aborted_final_only_request_reports_the_text_so_far(fake_engine):
    engine = fake_engine()
    engine.add_request("r", "ab", SamplingParams(max_tokens=50, ignore_eos=True, **GREEDY), final_only=True)
    for _ in range(6):
        assert engine.step() == []
    out = engine.abort_request("r")
    assert out.finish_reason == "abort" and out.text == "".join(chr(t) for t in out.token_ids) and out.text


@pytest.mark.parametrize("final_only", [False, True])
def test_an_abort_after_an_interrupted_step_drops_its_placeholder(fake_engine, final_only):
    """LLM.generate aborts its requests when the host's wait is interrupted (Ctrl-C): the step in
    flight was advanced (a placeholder token) but never resolved."""
    engine = fake_engine()
    engine.add_request("r", "ab", SamplingParams(max_tokens=50, ignore_eos=True, **GREEDY), final_only=final_only)
    for _ in range(6):
        engine.step()
    engine.scheduler.advance(engine._in_flight.batch)  # what step() does before it waits
    out = engine.abort_request("r")
    assert out.finish_reason == "abort" and min(out.token_ids) >= 0
    assert out.text == "".join(chr(t) for t in out.token_ids) == "cdefghijkl"[:len(out.token_ids)] and out.text
    assert not engine.has_unfinished_requests()


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


# --- real tiny checkpoints on the CPU ---------------------------------------------------------

MODELS = ["tiny-llama", "tiny-mistral", "tiny-qwen2"]
PROMPTS = [
    "The quick brown fox",
    "Retrieval augmented generation combines a search engine with a language model, and the server",
    "A",
]


@pytest.fixture
def tiny_llm(tiny_checkpoints):
    """tiny_llm(name="tiny-llama", **config) -> an LLM on the CPU."""
    def make(name: str = "tiny-llama", **config) -> LLM:
        config.setdefault("device", "cpu")
        config.setdefault("max_model_len", 256)
        return LLM(str(tiny_checkpoints[name]), **config)

    return make


def hf_greedy(path: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = _hf_model(path)
    generation = copy.deepcopy(model.generation_config)
    generation.eos_token_id = None  # exactly max_new_tokens, as ignore_eos
    generation.pad_token_id = 0
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             generation_config=generation, do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()


@functools.cache
def _hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def ids_by_request(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize("name", MODELS)
def test_greedy_matches_hf_transformers(name, tiny_llm, tiny_checkpoints):
    # A 32-token budget splits the long prompt into chunks next to the others' decodes.
    llm = tiny_llm(name, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=12, ignore_eos=True, **GREEDY)
    outputs = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outputs):
        ids = llm.tokenizer.encode(prompt)
        assert out.prompt_token_ids == ids
        assert out.token_ids == hf_greedy(tiny_checkpoints[name], ids, 12), prompt
        # incremental detokenization agrees with decoding the whole output at once
        assert out.text == llm.tokenizer.decode(out.token_ids)


def test_a_sequence_in_a_continuous_batch_decodes_as_alone(tiny_llm):
    llm = tiny_llm(max_num_batched_tokens=24)
    prompts = [p * k for p, k in zip(PROMPTS, (3, 1, 5))] + ["Each request is split into tokens."]
    lengths = [14, 9, 20, 6]
    alone = [llm.generate([p], SamplingParams(max_tokens=n, ignore_eos=True, **GREEDY))[0].token_ids
             for p, n in zip(prompts, lengths)]

    engine = llm.engine
    arrivals = {0: [0], 2: [1], 3: [2], 7: [3]}  # step -> requests joining the running batch
    outs: dict[str, list[int]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for i in arrivals.get(step, []):
            engine.add_request(f"r{i}", prompts[i], SamplingParams(max_tokens=lengths[i], ignore_eos=True, **GREEDY))
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.token_ids
        step += 1
    assert [outs[f"r{i}"] for i in range(4)] == alone


def test_preemption_with_a_tiny_kv_pool_keeps_outputs_identical(tiny_llm):
    prompts = [f"{p} {i}" for i, p in enumerate(PROMPTS * 2)]
    params = SamplingParams(max_tokens=24, ignore_eos=True, **GREEDY)
    expected = ids_by_request(tiny_llm().generate(prompts, params))
    # 10 blocks of 16 tokens; each request needs 2-4 blocks, six at once need far more.
    llm = tiny_llm(num_kv_blocks=10, block_size=16)
    got = ids_by_request(llm.generate(prompts, params))
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0
    assert got == expected
    assert stats.kv_blocks_used == 0


def test_prefix_cache_hits_give_identical_outputs(tiny_llm):
    base = PROMPTS[1] * 2  # > 2 blocks of 16 tokens
    prompts = [base, base + " and more", base]
    params = SamplingParams(max_tokens=10, ignore_eos=True, **GREEDY)
    uncached = ids_by_request(tiny_llm(enable_prefix_caching=False).generate(prompts, params))
    llm = tiny_llm()
    first = llm.generate([base], params)[0]
    assert first.stats.num_cached_tokens == 0
    outs = llm.generate(prompts, params)
    assert all(o.stats.num_cached_tokens > 0 for o in outs)
    assert ids_by_request(outs) == uncached and first.token_ids == uncached[0]


def test_abort_on_a_real_model_frees_every_block(tiny_llm):
    engine = tiny_llm().engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.get_stats().kv_blocks_used > 0
    for i in range(len(PROMPTS)):
        assert engine.abort_request(f"r{i}").finish_reason == "abort"
    assert engine.get_stats().kv_blocks_used == 0 and not engine.has_unfinished_requests()


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_llm):
    llm = tiny_llm()
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=42, max_tokens=16, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], seeded)[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=n, ignore_eos=True) for n in (5, 20)]
    in_batch = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [others[0], seeded, others[1]])[1].token_ids
    assert in_batch == alone
    other_seed = llm.generate([PROMPTS[0]], dataclasses.replace(seeded, seed=43))[0].token_ids
    assert other_seed != alone


def test_stop_strings_max_tokens_and_min_tokens_on_a_real_model(tiny_llm):
    llm = tiny_llm()
    greedy = SamplingParams(max_tokens=20, ignore_eos=True, **GREEDY)
    ref = llm.generate([PROMPTS[0]], greedy)[0]
    assert ref.finish_reason == "length" and len(ref.token_ids) == 20

    stop = ref.text[6:9]
    stopped = llm.generate([PROMPTS[0]], dataclasses.replace(greedy, stop=[stop]))[0]
    assert stopped.finish_reason == "stop" and stopped.text == ref.text[:ref.text.index(stop)]
    assert stopped.stop_reason == stop and ref.stop_reason is None
    kept = llm.generate([PROMPTS[0]], dataclasses.replace(greedy, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.stop_reason == stop and kept.text == ref.text[:ref.text.index(stop) + len(stop)]

    short = llm.generate([PROMPTS[0]], dataclasses.replace(greedy, max_tokens=5))[0]
    assert short.finish_reason == "length" and short.token_ids == ref.token_ids[:5] and short.stop_reason is None

    # Make the 2nd greedy token a stop token: it ends the output, unless min_tokens masks it.
    stop_id = ref.token_ids[1]
    ended = llm.generate([PROMPTS[0]], dataclasses.replace(greedy, stop_token_ids=[stop_id]))[0]
    assert ended.finish_reason == "stop" and ended.token_ids == ref.token_ids[:ref.token_ids.index(stop_id) + 1]
    assert ended.stop_reason == stop_id
    held = llm.generate([PROMPTS[0]], dataclasses.replace(greedy, stop_token_ids=[stop_id], min_tokens=6))[0]
    assert len(held.token_ids) >= 6 and stop_id not in held.token_ids[:5]



def test_top_logprobs_follow_each_token_through_the_streams(fake_engine):
    """The counting model puts all its mass on the next byte: every token is rank 1, its logprob near
    0, and the 2 most likely tokens are that byte and one other."""
    engine = fake_engine()
    engine.add_request("r", "abc", SamplingParams(max_tokens=4, logprobs=2, **GREEDY))
    outs = drain(engine)["r"]
    last = outs[-1]
    assert len(last.top_logprobs) == len(last.logprobs) == len(last.token_ids) == 4
    assert sum(len(o.delta_top_logprobs) for o in outs) == 4
    for token, top in zip(last.token_ids, last.top_logprobs):
        assert top.rank == 1 and list(top.top)[0] == token and len(top.top) == 2
