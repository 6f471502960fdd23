"""Structured output through the OpenAI frontend with the official `openai` package: `response_format`
json_object and json_schema (chat and completions, streamed and not) from the random demo model sampled
at temperature 1, which only the constraint makes parse and validate; vLLM's guided_* keys and
structured_outputs passed through; bad formats, conflicts and schemas the compiler refuses are 400
naming the field."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from openai import BadRequestError

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Describe a city as JSON."}]
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "population": {"type": "integer", "minimum": 0, "maximum": 100000},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["old", "big", "wet"]}, "maxItems": 3},
    "capital": {"type": "boolean"}},
    "required": ["city", "population", "tags", "capital"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
SAMPLED = {"temperature": 1.0, "max_tokens": 200}


def chat_text(client, stream: bool, **kwargs) -> tuple[str, str]:
    """The answer's text and finish reason, streamed or whole."""
    if not stream:
        [choice] = client.chat.completions.create(model="llm", messages=HELLO, **kwargs).choices
        return choice.message.content, choice.finish_reason
    chunks = [c for c in client.chat.completions.create(model="llm", messages=HELLO, stream=True, **kwargs)
              if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_schema_answers_validate(client, stream):
    for seed in range(2):
        text, reason = chat_text(client, stream, response_format=JSON_SCHEMA, seed=seed, **SAMPLED)
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_answers_parse_as_objects(client):
    """Any object: the random model may write a long one, so an answer cut at max_tokens (a prefix) is
    skipped; whole ones must parse, streamed and not."""
    for stream in (False, True):
        whole = 0
        for seed in range(6):
            text, reason = chat_text(client, stream, response_format={"type": "json_object"}, seed=seed,
                                     temperature=1.0, max_tokens=256)
            if reason == "stop":
                assert isinstance(json.loads(text), dict), text
                whole += 1
        assert whole >= 2
    text, _ = chat_text(client, False, response_format={"type": "text"}, temperature=0, max_tokens=8)
    assert text   # text: no constraint


def test_completions_take_response_format_too(client):
    answer = client.completions.create(model="llm", prompt="City:", seed=3, extra_body={"response_format": JSON_SCHEMA},
                                       **SAMPLED)
    jsonschema.validate(json.loads(answer.choices[0].text), SCHEMA)
    chunks = [c for c in client.completions.create(model="llm", prompt="City:", seed=4, stream=True,
                                                   extra_body={"response_format": JSON_SCHEMA}, **SAMPLED) if c.choices]
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks)), SCHEMA)


@pytest.mark.parametrize("extra, check", [
    ({"guided_regex": r"[A-Z]{2}-\d{3}"}, lambda text: re.fullmatch(r"[A-Z]{2}-\d{3}", text)),
    ({"guided_choice": ["north", "south"]}, lambda text: text in ("north", "south")),
    ({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    ({"guided_grammar": 'root ::= "id" [0-9] [0-9]'}, lambda text: re.fullmatch(r"id\d\d", text)),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda text: text in ("yes", "no")),
], ids=["regex", "choice", "json", "grammar", "structured_outputs"])
def test_vllm_guided_keys_pass_through(client, extra, check):
    text, _ = chat_text(client, False, extra_body=extra, seed=5, **SAMPLED)
    assert check(text), text
    completion = client.completions.create(model="llm", prompt="Answer:", seed=6, extra_body=extra, **SAMPLED)
    assert check(completion.choices[0].text), completion.choices[0].text


@pytest.mark.parametrize("kwargs, param, message", [
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name", "name is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}},
     "response_format.json_schema.schema", "must be a JSON schema object"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", 'Unsupported type "nonsense"'),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a+"}}, "response_format",
     "response_format and guided_regex both constrain the output"),
    ({"extra_body": {"guided_regex": "(["}}, "guided_regex", "the regex constraint is invalid"),
    ({"extra_body": {"guided_choice": ["a"], "guided_regex": "a"}}, "guided_regex",
     "both constrain the output"),
    ({"extra_body": {"functions": [{"name": "f"}]}}, "functions", "send 'tools' instead"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"p": {"$ref": "#p"}, "q": {"$anchor": "p", "type": "integer"}}}}}},
     "response_format.json_schema.schema", "a reference by anchor"),
], ids=["no-json-schema", "no-name", "schema-not-object", "unknown-type", "schema-refused", "conflict",
        "bad-regex", "two-guided-keys", "legacy-functions", "anchor-ref"])
def test_bad_formats_are_400_naming_the_field(client, kwargs, param, message):
    for stream in (False, True):
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model="llm", messages=HELLO, max_tokens=4, stream=stream, **kwargs)
        assert refused.value.body["param"] == param and message in refused.value.message, refused.value.body
