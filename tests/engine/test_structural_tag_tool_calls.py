"""The structural tag of `tool_choice: "auto"` with strict tools (the frontend's tool_grammar.py), on the
engine: a tiny random model sampled at temperature 1 writes free text, and every tool call in what it
writes, read back by the frontend's reader of that format, names one of the tools and validates
(jsonschema) against the strict tool's schema. A random model never spells a trigger by chance, so each
format is also sampled with its calls made obligatory (the same tag, its free-text alternative taken
away): there only the constraint makes the calls. A legacy (vLLM) tag is followed; bad tags fail the
request with a message naming the problem."""
from __future__ import annotations

import json

import jsonschema
import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (a fixture)

from llm_engine import LLM, SamplingParams
from llm_engine.engine.structured_output import GrammarCompiler
from llm_engine.sampling_params import StructuredOutputs
from ragstack.openai_frontend.tool_grammar import structural_tag
from ragstack.openai_frontend.tool_parsers import AUTO, collect

CONFIG = dict(device="cpu", dtype="float32", max_model_len=512, block_size=4, num_kv_blocks=512)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}},
         {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}]   # not strict
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "note": {"type": "object"}}
SEEDS = 8


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    with LLM(str(tiny_checkpoints["tiny-llama"]), **CONFIG) as made:
        yield made


def forced(parser: str, tag: str) -> str:
    """The tag with its calls obligatory: the same call grammar, no way around it."""
    value = json.loads(tag)
    fmt = value["format"]
    if parser == "hermes":     # one of its tags first, then the tag as it is (free text, more calls)
        value["format"] = {"type": "sequence", "elements": [{"type": "or", "elements": fmt["tags"]}, fmt]}
    else:                      # llama3_json: the calls alternative; mistral: the answer that starts with them
        value["format"] = fmt["elements"][0]
    return json.dumps(value)


def sample(llm, tag: str, max_tokens: int, n: int = SEEDS):
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                             structured_outputs=StructuredOutputs(structural_tag=tag)) for seed in range(n)]
    return llm.generate(["Call a tool or answer:"] * n, params)


def checked_calls(parser: str, text: str, parallel: bool = True) -> tuple[str, list[dict]]:
    content, calls = collect(AUTO[parser](parallel, strict=True), text)   # as the frontend reads strict tools
    for call in calls:
        assert call["function"]["name"] in SCHEMAS, text
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])
    return content, calls


@pytest.mark.parametrize("parser", sorted(AUTO))
def test_free_text_stays_free_and_calls_follow_the_tools(llm, parser):
    tag = structural_tag(parser, TOOLS, parallel=True)
    contents = []
    for out in sample(llm, tag, max_tokens=16):
        content, _ = checked_calls(parser, out.text)
        contents.append(content)
    assert sum(1 for c in contents if c.strip()) >= SEEDS // 2, contents   # text, as the model wrote it
    called = 0
    # The strict tools only: a random model's "any object" for `note` runs long (the matcher test below has it).
    for out in sample(llm, forced(parser, structural_tag(parser, TOOLS[:2], parallel=True)), max_tokens=100):
        content, calls = checked_calls(parser, out.text)
        called += bool(calls)
        if out.finish_reason == "stop":
            assert calls, (parser, out.text)
            if parser != "hermes":   # hermes: free text follows the first call, until the model ends it
                assert not content.strip(), out.text
    assert called >= SEEDS // 2, parser


def test_without_parallel_calls_one_call_ends_the_answer(llm):
    tag = forced("hermes", structural_tag("hermes", TOOLS, parallel=False))
    for out in sample(llm, tag, max_tokens=100, n=4):
        _, calls = checked_calls("hermes", out.text, parallel=False)
        if out.finish_reason == "stop":
            assert len(calls) == 1 and out.text.endswith("</tool_call>"), out.text


def test_a_legacy_vllm_structural_tag_is_followed(llm):
    tag = {"type": "structural_tag", "triggers": ["<f="],
           "structures": [{"begin": "<f=add>", "schema": ADD, "end": "</f>"}]}
    forced_tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f=add>", "end": "</f>",
                                                       "content": {"type": "json_schema", "json_schema": ADD}}}
    for spec, max_tokens in ((tag, 16), (forced_tag, 60)):
        for out in sample(llm, json.dumps(spec), max_tokens, n=4):
            if "<f=add>" in out.text and out.finish_reason == "stop":
                arguments = out.text.split("<f=add>", 1)[1].split("</f>", 1)[0]
                jsonschema.validate(json.loads(arguments), ADD)
                assert ", " in arguments or arguments.count(":") == 1   # compact, as every JSON region


@pytest.mark.parametrize("tag, message", [
    ('{"type": "structural_tag", "format": {"type": "nope"}}', "Format type not recognized: nope"),
    ('{"type": "structural_tag", "format": {"type": "json_schema", "json_schema": {"type": "nonsense"}}}',
     'Unsupported type "nonsense"'),
    ('{"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b"]}',
     "One tag does not match any trigger"),
    ('{"structures": 1, "triggers": []}', "a legacy structural tag needs 'structures'"),
])
def test_a_bad_structural_tag_fails_naming_the_problem(llm, tag, message):
    tokenizer = llm.engine.tokenizer
    compiler = GrammarCompiler(tokenizer, llm.engine.vocab_size, tokenizer.eos_token_ids, compile_timeout_s=10)
    with pytest.raises(ValueError) as info:
        compiler.submit(StructuredOutputs(structural_tag=tag)).result()
    compiler.close()
    assert str(info.value).startswith("structured output: the structural_tag constraint is invalid: ")
    assert message in str(info.value)


@pytest.mark.parametrize("tag, message", [
    ("{oops", "structured output structural_tag is not valid JSON"),
    ("[1]", "structural_tag must be an object"),
    ({"type": "structural_tag", "format": {"type": "any_text"}}, None),   # a dict, as vLLM's Python API takes it
])
def test_structural_tag_values_are_checked_when_the_params_are_made(tag, message):
    if message is None:
        assert json.loads(StructuredOutputs(structural_tag=tag).structural_tag) == tag
        return
    with pytest.raises(ValueError) as info:
        StructuredOutputs(structural_tag=tag)
    assert message in str(info.value)


@pytest.mark.parametrize("parser, text, accepted", [
    ("hermes", 'Hi.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\nDone.', True),
    ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": "1", "b": 2}}\n</tool_call>', False),
    ("hermes", '<tool_call>\n{"name": "sub", ', False),
    ("hermes", '<tool_call>\n{"name": "note", "arguments": {"x": [1, {}]}}\n</tool_call>', True),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}};{"name": "note", "parameters": {}}', True),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1}}', False),
    ("llama3_json", 'It is {"name": "add", "parameters": {"a": 1}}', True),   # content, as the reader takes it
    ("llama3_json", '<|python_tag|>{"name": "add"', False),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', True),
    ("mistral", '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]', True),   # as v0.3's template writes it
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}] and more', False),
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]note[ARGS]{}', True),
    ("mistral", '[{"name": "add", "arguments": {}}]', False),   # a bare list the reader would take as calls
])
def test_the_tag_takes_what_its_format_allows(llm, parser, text, accepted):
    tokenizer = llm.engine.tokenizer
    compiler = GrammarCompiler(tokenizer, llm.engine.vocab_size, tokenizer.eos_token_ids, compile_timeout_s=10)
    compiled = compiler.submit(StructuredOutputs(structural_tag=structural_tag(parser, TOOLS, True))).result()
    matcher = compiler.matcher(compiled).matcher
    took = matcher.accept_string(text) and matcher.accept_token(tokenizer.eos_token_ids[0])
    compiler.close()
    assert took == accepted
    if accepted:
        checked_calls(parser, text)
