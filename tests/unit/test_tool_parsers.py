"""Tool calls read from hand-written outputs of each model family's format (Qwen2.5/Hermes, Llama 3.1+ JSON,
Mistral), of `tool_choice` required (a JSON array) and of a named function: the same calls and content
whether the text arrives whole or split anywhere (every split size, random splits); text that is no
call stays content; `parallel` False keeps the first call."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragstack.openai_frontend.tool_parsers import (
    AUTO, Delta, Hermes, Llama3Json, Mistral, Named, Plain, Reader, Required, collect, joined)

WEATHER = {"city": "Paris", "unit": "celsius"}
ADD = {"a": 1, "b": [2, {"c": "x\"}y"}]}
CALLS = [("get_weather", WEATHER), ("add", ADD)]


def streamed(reader: Reader, pieces: list[str]) -> tuple[str, list[dict], list[dict]]:
    """Content, the calls assembled from the deltas, and the deltas themselves."""
    delta = Delta()
    for piece in pieces:
        delta.add(reader.feed(piece))
    delta.add(reader.finish())
    calls: dict[int, dict] = {}
    for entry in delta.tool_calls:
        if "id" in entry:
            assert entry["index"] not in calls and entry["type"] == "function"
            assert entry["id"].startswith("call_") and entry["function"]["arguments"] == ""
            calls[entry["index"]] = {"name": entry["function"]["name"], "arguments": ""}
        else:
            assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
            calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return delta.content, [calls[i] for i in sorted(calls)], delta.tool_calls


def split(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def parsed(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in calls]


def hermes_text(calls, before="", between="\n") -> str:
    blocks = [f'<tool_call>\n{json.dumps({"name": n, "arguments": a})}\n</tool_call>' for n, a in calls]
    return before + between.join(blocks)


FAMILIES = {
    "hermes": hermes_text(CALLS, before="Let me check that.\n"),
    "llama3_json": "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in CALLS),
    "mistral": "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in CALLS]),
}
CONTENT = {"hermes": "Let me check that.", "llama3_json": "", "mistral": ""}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 10_000])
def test_each_family_gives_the_same_calls_however_the_text_is_split(family, size):
    content, calls, _ = streamed(AUTO[family](), split(FAMILIES[family], size))
    assert parsed(calls) == CALLS and content == CONTENT[family]
    whole_content, whole_calls = collect(AUTO[family](), FAMILIES[family])
    assert whole_content == content and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                         for c in whole_calls] == CALLS
    assert len({c["id"] for c in whole_calls}) == 2


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(sorted(FAMILIES)), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_random_splits(family, cuts):
    text = FAMILIES[family]
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    content, calls, _ = streamed(AUTO[family](), pieces)
    assert parsed(calls) == CALLS and content == CONTENT[family]


def test_hermes_streams_content_at_once_and_holds_only_what_may_begin_a_tag():
    reader = Hermes()
    assert reader.feed("Hello wor").content == "Hello wor"
    assert reader.feed("ld <tool").content == "ld"          # " <tool" might open a call
    assert reader.feed("box> ok").content == " <toolbox> ok"
    rest = reader.finish()
    assert rest.content == "" and not rest.tool_calls and reader.calls == 0


def test_hermes_call_deltas_name_first_then_the_arguments():
    _, _, deltas = streamed(Hermes(), split(hermes_text(CALLS[:1]), 4))
    assert [set(d) for d in deltas] == [{"index", "id", "type", "function"}, {"index", "function"}]
    assert deltas[0]["function"]["name"] == "get_weather" and json.loads(deltas[1]["function"]["arguments"]) == WEATHER


@pytest.mark.parametrize("text", [
    "Nothing to call here.",
    "<tool_call>\nnot json\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',                     # no name
    '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',       # arguments not an object
])
def test_hermes_text_that_is_no_call_stays_content(text):
    content, calls, _ = streamed(Hermes(), split(text, 3))
    assert content == text and not calls


def test_hermes_an_unclosed_block_is_a_call_if_it_parses():
    content, calls, _ = streamed(Hermes(), ['<tool_call>\n{"name": "f", "arguments": {"x": 1}}'])
    assert parsed(calls) == [("f", {"x": 1})] and content == ""
    content, calls, _ = streamed(Hermes(), ['<tool_call>\n{"name": "f", "argu'])   # cut at max_tokens
    assert not calls and content == '<tool_call>\n{"name": "f", "argu'


def test_hermes_arguments_as_json_text_and_text_after_calls():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>\nDone.'
    content, calls, _ = streamed(Hermes(), split(text, 5))
    assert parsed(calls) == [("f", {"x": 1})] and content == "Done."


CALL_F = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize("text, content", [
    (f"Sure.{CALL_F}done", "Sure. done"),                      # no whitespace around the call: a space
    (f"Sure. {CALL_F}done", "Sure. done"),                     # the whitespace before it
    (f"Sure.\n{CALL_F}\n\nDone.", "Sure.\n\nDone."),           # the whitespace after it
    (f"Sure.\n{CALL_F}\n{CALL_F}  Done. ", "Sure.  Done."),      # two calls: one gap
    (f"{CALL_F}\nDone.", "Done."),                              # nothing before: no gap
    (f"Sure.\n{CALL_F}\n", "Sure."),                            # nothing after: no gap
])
def test_hermes_content_on_both_sides_of_a_call_stays_apart(text, content):
    for size in (1, 4, len(text)):
        found_content, calls, _ = streamed(Hermes(), split(text, size))
        assert found_content == content and len(calls) == text.count("<tool_call>")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parallel_false_keeps_the_first_call(family):
    content, calls, _ = streamed(AUTO[family](parallel=False), split(FAMILIES[family], 7))
    assert parsed(calls) == CALLS[:1] and content == CONTENT[family]


@pytest.mark.parametrize("text, calls", [
    ('{"name": "f", "parameters": {"x": 1}}', [("f", {"x": 1})]),
    ('  {"name": "f", "arguments": {}}  ', [("f", {})]),
    ('<|python_tag|>{"name": "f", "parameters": {"q": "a;b"}};{"name": "g", "parameters": {}}',
     [("f", {"q": "a;b"}), ("g", {})]),
])
def test_llama3_json_calls(text, calls):
    content, found, _ = streamed(Llama3Json(), split(text, 2))
    assert parsed(found) == calls and content == ""


@pytest.mark.parametrize("text, content, calls", [   # vLLM's test_llama3_json_tool_parser cases with text around
    ('Here is the result: {"name": "f", "parameters": {}} Would you like to know more?',
     "Here is the result: Would you like to know more?", [("f", {})]),
    ('Here are the results: {"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}; '
     '{"name": "f", "parameters": {"x": 2}} Would you like to know more?',
     "Here are the results: Would you like to know more?", [("f", {"x": 1}), ("g", {}), ("f", {"x": 2})]),
    ('{"name": "f", "parameters": {"query": "test"}} I used {searchTool} for this.', "I used {searchTool} for this.",
     [("f", {"query": "test"})]),
    ('Sure {like this}. {"answer": 4} then <|python_tag|>{"name": "g", "parameters": {"s": "}{"}}',
     "Sure {like this}. {\"answer\": 4} then", [("g", {"s": "}{"})]),
    ('[{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}}]', "", [("f", {"x": 1}), ("g", {})]),
    ('Results: [1, 2] {"name": "f", "parameters": {}}; {"answer": 1}', 'Results: [1, 2] {"answer": 1}', [("f", {})]),
    ('{"name": "f", "parameters": {}}<|python_tag|>{"name": "g", "parameters": {}}', "", [("f", {}), ("g", {})]),
])
def test_llama3_json_calls_with_text_around(text, content, calls):
    for size in (1, 2, 5, 1000):
        found_content, found, _ = streamed(Llama3Json(), split(text, size))
        assert parsed(found) == calls and found_content == content


@pytest.mark.parametrize("text, content, calls", [
    ('It is {"name": "f", "parameters": {}}', 'It is {"name": "f", "parameters": {}}', []),
    ('{"answer": 1} {"name": "f", "parameters": {}}', '{"answer": 1} {"name": "f", "parameters": {}}', []),
    ('[{"name": "f", "parameters": {}}]', '[{"name": "f", "parameters": {}}]', []),   # free text to the tag
    ('<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}} done', "done",
     [("f", {}), ("g", {})]),
])
def test_llama3_json_under_strict_tools_reads_calls_at_the_start_only(text, content, calls):
    """Strict tools' structural tag constrains calls at the start; an object in the free text after other text
    is not constrained, so it is not read as a call either."""
    for size in (1, 3, 1000):
        found_content, found, _ = streamed(Llama3Json(strict=True), split(text, size))
        assert parsed(found) == calls and found_content == content


def test_llama3_json_holds_text_only_while_it_may_begin_a_call():
    reader = Llama3Json()
    assert reader.feed("Use {").content == "Use"
    assert reader.feed('"a": 1} now').content == ' {"a": 1} now'       # not `{"name"`: content at once
    assert reader.feed(' and {"na').content == " and"
    assert reader.feed('me": "x", "parameters": {').content == ""      # a call, maybe: held until it closes
    assert reader.feed("}} done").content == ""
    delta = reader.finish()
    assert delta.content == " done" and [c["function"]["name"] for c in delta.tool_calls if "id" in c] == ["x"]


@pytest.mark.parametrize("text", [
    "The set \\frac{a}{b is wrong; " + "more prose. " * 50,
    'Use {"key: value} in the config, then ' + "more prose. " * 50,
    "function f(x) {\n" + "  console.log(x);\n" * 50 + "}",
])
def test_llama3_json_streams_braces_that_begin_no_call(text):
    """Review 17: any `{` held the rest of the answer until it closed, or to the end."""
    reader, sent = Llama3Json(), ""
    for piece in split(text, 4):
        sent += reader.feed(piece).content
    assert len(sent) >= len(text.rstrip()) - 4 and (sent + reader.finish().content) == text


@pytest.mark.parametrize("text", ["The answer is 4.", '{"answer": 4}', '<|python_tag|>print("hi")', "<|python",
                                  '{"name": "f", "param', "a } b { c"])
def test_llama3_json_other_text_is_content(text):
    content, calls, _ = streamed(Llama3Json(), split(text, 3))
    assert content == text and not calls


def test_llama3_json_content_streams_once_the_start_says_so():
    reader = Llama3Json()
    assert reader.feed("  ").content == ""          # not decided yet
    assert reader.feed("Hi").content == "  Hi"
    assert reader.feed(" there").content == " there"


@pytest.mark.parametrize("text, content, calls", [
    ('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', "", [("f", {"x": 1})]),
    ('[{"name": "f", "arguments": {"x": 1}}]', "", [("f", {"x": 1})]),     # the special token skipped
    ('Sure. [TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}', "Sure.", [("f", {"x": 1}), ("g", {})]),   # v11
    ('[TOOL_CALLS]f{"x": 1}', "", [("f", {"x": 1})]),
    ("[1] is the source.", "[1] is the source.", []),
    ("[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    ("Sure. [TOOL_CALLS] not json", "Sure. [TOOL_CALLS] not json", []),
    ('[{"a": 1}]', '[{"a": 1}]', []),
    ('[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}}]\nextra trailing data', "extra trailing data",
     [("f", {"x": 1})]),                                                   # vLLM streams the text after as content
    ('[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"x": 1}', "", [("f", {"x": 1})]),   # v11's id before the arguments
    ('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}] I will also check. [TOOL_CALLS][{"name": "g", '
     '"arguments": {}}]', "I will also check.", [("f", {"x": 1}), ("g", {})]),   # text between two lists
    ('[TOOL_CALLS]f[ARGS]{"x": 1} trailing text', "trailing text", [("f", {"x": 1})]),
])
def test_mistral(text, content, calls):
    for size in (1, 4, 100):
        found_content, found, _ = streamed(Mistral(), split(text, size))
        assert parsed(found) == calls and found_content == content


REQUIRED = json.dumps([{"name": n, "parameters": a} for n, a in CALLS])


@pytest.mark.parametrize("size", [1, 2, 3, 7, 10_000])
def test_required_streams_each_call_name_first_then_arguments_fragments(size):
    content, calls, deltas = streamed(Required(), split(REQUIRED, size))
    assert parsed(calls) == CALLS and content == ""
    assert [json.loads(c["arguments"]) for c in calls] == [WEATHER, ADD]
    if size == 1:   # arguments go out as they come: many fragments, the first right after the name
        assert len(deltas) > 20 and deltas[1]["function"]["arguments"] == "{"


@pytest.mark.parametrize("text, calls", [
    ('[{"parameters": {"x": 1}, "name": "f"}]', [("f", {"x": 1})]),   # arguments before the name
    ('[{"name": "f", "arguments": {"x": "]}"}}]', [("f", {"x": "]}"})]),
    ('[{"name": "f", "parameters": {}}]', [("f", {})]),
    ('[{"name": "f"}]', [("f", {})]),
    ('[{"name": "f", "parameters": 3}]', [("f", 3)]),
    ('[{"name": "f\\u00e9", "parameters": {"s": "\\\\"}}]', [("f\u00e9", {"s": "\\"})]),
])
def test_required_shapes(text, calls):
    for size in (1, 5, 1000):
        content, found, _ = streamed(Required(), split(text, size))
        assert parsed(found) == calls and content == ""


def test_required_cut_short_keeps_what_was_read():
    _, calls, _ = streamed(Required(), [REQUIRED[:30]])
    assert [c["name"] for c in calls] == ["get_weather"] and REQUIRED[:30].endswith(calls[0]["arguments"])


def test_named_and_plain():
    content, calls, deltas = streamed(Named("f"), ['{"x"', ": 1}"])
    assert parsed(calls) == [("f", {"x": 1})] and content == "" and len(deltas) == 3
    assert streamed(Named("f"), [])[1] == [{"name": "f", "arguments": ""}]     # nothing generated: still the call
    assert collect(Plain(), "<tool_call>x") == ("<tool_call>x", [])


def test_a_deltas_fragments_of_one_call_go_out_as_one_entry():
    reader = Named("f")
    first = joined(reader.feed('{"x"').tool_calls)   # the header and the first fragment
    assert first == [{"index": 0, "id": first[0]["id"], "type": "function",
                      "function": {"name": "f", "arguments": '{"x"'}}]
    assert joined(reader.feed(": 1}").tool_calls) == [{"index": 0, "function": {"arguments": ": 1}"}}]
    hermes = Hermes()
    two = joined(hermes.feed(FAMILIES["hermes"]).add(hermes.finish()).tool_calls)
    assert [entry["index"] for entry in two] == [0, 1] and all("id" in entry for entry in two)


def test_the_parser_setting_is_one_of_the_formats():
    from ragstack.openai_frontend.limits import FrontendLimits

    assert set(AUTO) == {"hermes", "llama3_json", "mistral"}
    assert FrontendLimits(tool_call_parser="mistral").to_args()[-2:] == ["--openai-tool-call-parser", "mistral"]
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        FrontendLimits(tool_call_parser="pythonic")


NAMES = frozenset({"get_weather", "add", "f"})


@pytest.mark.parametrize("family, text", [
    ("llama3_json", '{"name": "Tokyo", "country": "Japan"}'),           # a JSON answer, no arguments key
    ("llama3_json", '{"name": "ideX>9", "parameters": {"age": 12}}'),   # no such tool
    ("mistral", '[{"name": "Tokyo", "population": 37}, {"name": "Paris", "population": 11}]'),
    ("mistral", '[TOOL_CALLS] [{"name": "weather", "arguments": {}}]'),
    ("hermes", '<tool_call>\n{"name": "get_weather"}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>'),
])
def test_json_answers_and_calls_of_tools_not_given_are_content(family, text):
    """Review 16: a response_format answer with a "name" became a call with its data dropped; vLLM's parsers
    need the arguments key, and OpenAI never calls a tool the request did not give."""
    for size in (1, 3, 1000):
        content, calls, _ = streamed(AUTO[family](names=NAMES), split(text, size))
        assert content == text and not calls


def test_mistral_call_ids_are_nine_letters_and_digits():
    """Mistral's chat templates refuse any other id in the conversation sent back."""
    readers = [(Mistral(names=NAMES, short_ids=True), FAMILIES["mistral"]), (Required(short_ids=True), REQUIRED),
               (Named("f", short_ids=True), "{}")]
    for reader, text in readers:
        _, calls = collect(reader, text)
        assert calls and all(len(c["id"]) == 9 and c["id"].isascii() and c["id"].isalnum() for c in calls)
    _, calls = collect(Hermes(), FAMILIES["hermes"])
    assert all(c["id"].startswith("call_") and len(c["id"]) == 29 for c in calls)


@pytest.mark.parametrize("text", [
    '{"plan": [{"name": "f", "parameters": {"q": "x"}}]}',
    '{"tool": {"name": "f", "parameters": {}}, "why": "y"} ok',
    'Example: {"calls": [{"name": "f", "parameters": {}}], "n": 2} ok',
])
def test_llama3_json_reads_no_call_inside_json_content(text):
    """Review 18: a value that begins no call streams through whole; a call-shaped value inside it is data."""
    for size in (1, 3, 1000):
        content, calls, _ = streamed(Llama3Json(names=NAMES), split(text, size))
        assert content == text and not calls


@pytest.mark.parametrize("reader", [lambda: Llama3Json(strict=True), lambda: Mistral()])
def test_strict_readers_take_only_jsons_whitespace_before_a_call(reader):
    """The structural tag's free text may begin with other spaces; a call after them is not constrained."""
    for text in ('\u00a0{"name": "f", "parameters": {}}', '\u2028[{"name": "f", "arguments": {}}]'):
        content, calls = collect(reader(), text)
        assert not calls and content == text


def test_odd_arguments_are_no_call():
    deep = '{"name": "f", "parameters": ' + "[" * 3000 + "]" * 3000 + "}"
    surrogate = '{"name": "f", "parameters": {"s": "\\ud800"}}'
    for text in (deep, surrogate):
        for reader in (Llama3Json(), Hermes()):
            body = f"<tool_call>\n{text}\n</tool_call>" if isinstance(reader, Hermes) else text
            assert not collect(reader, body)[1]


def test_llama3_json_reads_a_whole_answer_in_linear_time():
    import time
    for text in ("a [" * 40000, "[[0, 1], [1, 2]], " * 8000, "see [link](url) and {x}. " * 6000):
        started = time.perf_counter()
        assert collect(Llama3Json(), text) == (text, [])
        assert time.perf_counter() - started < 0.5, len(text)
