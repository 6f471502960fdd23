"""Structured output on a tiny random model: whatever it samples (temperature 1), the text follows
the constraint; the engine's other paths (preemption, async scheduling, prefix caching, stop strings,
max_tokens, abort, a slow or bad constraint) keep it so."""
from __future__ import annotations

import asyncio
import json
import re
import time

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM, RequestFailedError, RequestRefusedError, SamplingParams
from llm_engine.engine.async_engine import AsyncLLMEngine
from llm_engine.engine.structured_output import GrammarCompiler
from llm_engine.sampling_params import StructuredOutputs

PROMPT = "Answer in the format asked:"
CONFIG = dict(device="cpu", dtype="float32", max_model_len=512, block_size=4, num_kv_blocks=512)


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    with LLM(str(tiny_checkpoints["tiny-llama"]), **CONFIG) as made:
        yield made


def sampled(llm, spec: StructuredOutputs, n: int = 4, max_tokens: int = 160, **kw):
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, structured_outputs=spec, **kw)
              for seed in range(n)]
    return llm.generate([PROMPT] * n, params)


# --- every constraint kind holds --------------------------------------------------------------

def bounded(leaf_only: bool = False):
    """JSON schemas whose every instance is short, so a random model completes them."""
    leaves = st.one_of(
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-1000, 1000), st.integers(0, 500)),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(lambda vals: {"enum": vals}, st.lists(st.text("abcxyz ", min_size=1, max_size=5),
                                                        min_size=1, max_size=4, unique=True)),
    )
    if leaf_only:
        return leaves
    arrays = st.builds(lambda item, hi: {"type": "array", "items": item, "maxItems": hi}, leaves, st.integers(0, 3))
    return st.recursive(
        st.one_of(leaves, arrays),
        lambda inner: st.builds(
            lambda props, data: {"type": "object", "properties": props, "additionalProperties": False,
                                 "required": data.draw(st.lists(st.sampled_from(sorted(props)), unique=True))},
            st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), inner, min_size=1, max_size=4),
            st.data()),
        max_leaves=8)


@pytest.mark.slow  # 30 random schemas, 4 samples each: the fast tier's JSON schema checks are SCHEMA's below
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=bounded())
def test_json_schema_outputs_are_valid_instances(llm, schema):
    for out in sampled(llm, StructuredOutputs(json=schema), max_tokens=256):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)


def test_json_object_outputs_are_objects(llm):
    for out in sampled(llm, StructuredOutputs(json_object=True), n=6, max_tokens=256):
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict), out.text
        else:  # a random model may write one long string: what it wrote is an object's beginning
            assert out.finish_reason == "length" and out.text.startswith("{")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.sampled_from([
    r"[a-z]{3}-\d{2,4}", r"(yes|no)", r"\d+\.\d{2}", r"[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5}){0,2}",
    r"0x[0-9a-f]{1,8}", r"\(\d{3}\) \d{3}-\d{4}", r"[^\n\"]{1,10}", r"(ab|cd)*e",
]))
def test_regex_outputs_match(llm, pattern):
    for out in sampled(llm, StructuredOutputs(regex=pattern), max_tokens=64):
        if out.finish_reason == "length":  # an unbounded repeat the model did not end
            assert re.match(r"\(ab\|cd\)\*|\[", pattern), (pattern, out.text)
            continue
        assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), (pattern, out.text)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choices=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1,
                                max_size=8), min_size=1, max_size=5, unique=True))
def test_choice_outputs_are_one_of_the_choices(llm, choices):
    for out in sampled(llm, StructuredOutputs(choice=choices), max_tokens=64):
        assert out.finish_reason == "stop" and out.text in choices, (choices, out.text)


def test_an_ebnf_grammar_is_followed(llm):
    grammar = 'root ::= "(" expr ")"\nexpr ::= num | num "+" expr\nnum ::= [1-9] [0-9]?'
    for out in sampled(llm, StructuredOutputs(grammar=grammar), n=6, max_tokens=64):
        if out.finish_reason == "stop":
            assert re.fullmatch(r"\((?:[1-9][0-9]?\+)*[1-9][0-9]?\)", out.text), out.text
        else:
            assert re.match(r"\((?:[1-9][0-9]?\+)*", out.text), out.text


@pytest.mark.parametrize("string", [{"type": "string"}, {"type": "string", "maxLength": 4}])
def test_json_strings_take_no_utf8_encoded_surrogate(llm, string):
    """xgrammar 0.2.8 let a random model write ED B9 84 (U+DE44, which JSON text cannot hold) in a string."""
    tokenizer = llm.engine.tokenizer
    surrogate = [172, 120, 229]  # tiny-llama's byte tokens for ED B9 84
    assert tokenizer.hf_tokenizer.convert_ids_to_tokens(surrogate) == ["í", "¹", "Ħ"]
    compiler = GrammarCompiler(tokenizer, llm.engine.vocab_size, tokenizer.eos_token_ids, compile_timeout_s=10)
    compiled = compiler.submit(StructuredOutputs(json=string)).result()
    matcher = compiler.matcher(compiled).matcher
    assert matcher.accept_string('"A') and matcher.accept_token(surrogate[0])
    assert not matcher.accept_token(surrogate[1])
    assert compiler.matcher(compiled).matcher.accept_string('"Aé"')  # other characters beyond ASCII pass
    compiler.close()


# --- the rest of the engine keeps the constraint ----------------------------------------------

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 4},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "tags", "n"], "additionalProperties": False}


def guided_and_free(n: int) -> tuple[list[str], list[SamplingParams]]:
    """Prompts of different lengths; every other request is guided; seeded, so each request's
    tokens depend on nothing but itself."""
    prompts = [PROMPT + " item" * (3 * i) for i in range(n)]
    params = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=96,
                             structured_outputs=StructuredOutputs(json=SCHEMA) if i % 2 == 0 else None)
              for i in range(n)]
    return prompts, params


def check_guided(outs) -> None:
    for i, out in enumerate(outs):
        if i % 2 == 0:
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), SCHEMA)


@pytest.mark.parametrize("variant", [
    dict(num_kv_blocks=64, max_num_seqs=8),  # the pool is too small for all: requests are preempted
    dict(async_scheduling=False),
    dict(max_num_batched_tokens=16),  # long prompts prefilled in chunks beside guided decodes
], ids=["preemption", "sync-steps", "chunked-prefill"])
def test_batches_with_preemption_chunking_and_sync_steps_give_each_request_its_own_tokens(tiny_checkpoints, llm,
                                                                                           variant):
    prompts, params = guided_and_free(8)
    expected = llm.generate(prompts, params)
    check_guided(expected)
    with LLM(str(tiny_checkpoints["tiny-llama"]), **{**CONFIG, **variant}) as other:
        got = other.generate(prompts, params)
        if "num_kv_blocks" in variant:
            assert other.engine.get_stats().num_preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]


def test_a_prefix_cache_hit_gives_the_same_structured_output(llm):
    prompts, params = guided_and_free(2)
    first = llm.generate(prompts[:1], params[:1])[0]
    again = llm.generate(prompts[:1], params[:1])[0]
    assert again.stats.num_cached_tokens > 0 and again.token_ids == first.token_ids


def test_max_tokens_inside_the_structure_ends_with_length(llm):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=3, structured_outputs={"json": SCHEMA}))[0]
    assert out.finish_reason == "length" and out.text.startswith('{"n')


def test_min_tokens_does_not_hold_back_the_end_of_a_structured_output(llm):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=32, min_tokens=20,
                                                structured_outputs={"choice": ["yes", "no"]}))[0]
    assert out.finish_reason == "stop" and out.text in ("yes", "no"), out.text


def test_a_stop_string_ends_a_structured_output(llm):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=64, stop=['"tags"'],
                                                structured_outputs={"json": SCHEMA}))[0]
    assert out.finish_reason == "stop" and out.text.startswith('{"name": "') and '"tags"' not in out.text


@pytest.mark.parametrize("spec, message", [
    ({"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
     'the json constraint is invalid: Unsupported type "nonsense"'),
    ({"regex": "(["}, "the regex constraint is invalid: Regex parsing error at position 3: Unclosed '['"),
    ({"grammar": "root ::= x"}, 'the grammar constraint is invalid: EBNF parser error at line 1, column 10: '
                                'Rule "x" is not defined'),
])
def test_a_constraint_that_does_not_compile_fails_its_request_alone(llm, spec, message):
    ok = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    engine = llm.engine
    engine.add_request("bad", PROMPT, SamplingParams(structured_outputs=spec))
    engine.add_request("good", PROMPT, ok)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert outs["bad"].finish_reason == "error" and message in outs["bad"].error
    assert outs["bad"].error.startswith("ValueError: structured output:")
    assert outs["good"].finish_reason == "length"


@pytest.mark.parametrize("spec", [{"grammar": "root ::= root"}, {"json": {"$ref": "#"}}, {"regex": "[^\\s\\S]"}])
def test_a_constraint_with_no_way_on_fails_as_the_requests_own_input(llm, spec):
    """A constraint that compiles but allows no token: its request fails as one refused (a ValueError, which
    the llm answers INVALID_ARG), not as an engine fault."""
    with pytest.raises(RequestRefusedError) as info:
        sampled(llm, spec, n=1, max_tokens=8)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("structured output: the constraint allows no token after 0 generated")


@pytest.mark.parametrize("spec, message", [
    ({"json": "{not json"}, "structured output json is not valid JSON"),
    ({"json": "[1]"}, "structured output json must be a JSON schema"),
    ({"regex": "a", "choice": ["b"]}, "takes exactly one of json, json_object, regex, choice, grammar, "
                                      "structural_tag; got ['regex', 'choice']"),
    ({"choice": []}, "choice must be a non-empty list of non-empty strings"),
    ({"jsn": "{}"}, "unknown structured output key(s) ['jsn']"),
])
def test_malformed_constraints_are_refused_when_the_params_are_made(spec, message):
    with pytest.raises(ValueError) as info:
        SamplingParams(structured_outputs=spec)
    assert message in str(info.value)


@pytest.fixture
def slow_compiles(monkeypatch):
    real = GrammarCompiler._compile

    def slow(self, spec):
        time.sleep(1.0)
        return real(self, spec)

    monkeypatch.setattr(GrammarCompiler, "_compile", slow)


def test_a_compile_past_the_timeout_fails_the_request(tiny_checkpoints, slow_compiles):
    with LLM(str(tiny_checkpoints["tiny-llama"]), **CONFIG, structured_output_compile_timeout_s=0.2) as llm:
        started = time.monotonic()
        with pytest.raises(RequestFailedError, match=r"took longer than 0.2 s \(structured_output_compile_timeout_s\)"):
            llm.generate([PROMPT], SamplingParams(structured_outputs={"regex": "a+"}))
        assert time.monotonic() - started < 0.9


def test_a_request_aborted_while_its_grammar_compiles_ends_and_the_engine_serves_on(llm, slow_compiles):
    engine = llm.engine
    engine.add_request("waiting", PROMPT, SamplingParams(structured_outputs={"regex": "b+"}))
    engine.step()
    assert engine.abort_request("waiting").finish_reason == "abort"
    assert not engine.has_unfinished_requests() and engine.get_stats().kv_blocks_used == 0
    out = llm.generate([PROMPT], SamplingParams(max_tokens=8, structured_outputs={"regex": "c{2,5}"}))[0]
    assert re.fullmatch("c{2,5}", out.text)


def test_a_repeated_constraint_is_compiled_once(llm):
    compiler = llm.engine._grammar_compiler()
    spec = StructuredOutputs(json=SCHEMA)
    assert compiler.submit(spec) is compiler.submit(StructuredOutputs(json=json.dumps(SCHEMA)))


def test_a_bad_constraint_reaches_a_streaming_caller_as_value_error(tiny_checkpoints):
    engine = AsyncLLMEngine(LLM(str(tiny_checkpoints["tiny-llama"]), **CONFIG).engine)

    async def main():
        return [o async for o in engine.add_request("r", PROMPT, SamplingParams(structured_outputs={"regex": "(["}))]

    try:
        with pytest.raises(ValueError, match="the regex constraint is invalid"):
            asyncio.run(main())
    finally:
        engine.shutdown(timeout=5)
