"""Schemas through the OpenAI frontend to the llm, with the official `openai` package. vLLM's guided_json,
structured_outputs' json and an object structural_tag nest as deep as the frontend's max_json_depth lets a
body nest (32 levels): they reach the llm as JSON text, past its 16 levels of sampling_parameters, and the
random demo model's answers validate. Keywords the grammar compiler would not enforce are 400 naming the
keyword's field, whichever way the schema comes, streamed or not."""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai import BadRequestError

pytestmark = pytest.mark.server
HELLO = [{"role": "user", "content": "Answer in JSON."}]
SAMPLED = {"temperature": 1.0, "max_tokens": 400}


def deep(levels: int) -> dict:
    """An object schema `levels` objects deep (2 * levels + 1 JSON levels), a boolean at the bottom."""
    schema = {"type": "boolean"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


# The deepest each fits in a body of 32 levels; 7 levels failed when the objects reached the llm as objects.
@pytest.mark.parametrize("extra, schema", [
    ({"guided_json": deep(15)}, deep(15)),
    ({"structured_outputs": {"json": deep(14)}}, deep(14)),
], ids=["guided_json", "structured_outputs.json"])
def test_deep_schema_objects_answer_valid_json(client, extra, schema):
    for seed in range(2):
        [choice] = client.chat.completions.create(model="llm", messages=HELLO, seed=seed, extra_body=extra,
                                                  **SAMPLED).choices
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_a_deep_structural_tag_object_answers_its_format(client):
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                "content": {"type": "json_schema", "json_schema": deep(12)}}}
    [choice] = client.chat.completions.create(model="llm", messages=HELLO, seed=1, extra_body={"structural_tag": tag},
                                              **SAMPLED).choices
    text = choice.message.content
    assert text.startswith("<a>") and text.endswith("</a>"), text
    jsonschema.validate(json.loads(text[3:-4]), deep(12))


TAGS = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["tags"]}
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3}}}
PAIR = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]}}


def tool(parameters: dict, strict: bool = False) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": strict}}


@pytest.mark.parametrize("kwargs, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": TAGS}}},
     "response_format.json_schema.schema.properties.tags.uniqueItems"),
    ({"extra_body": {"guided_json": {"$ref": "http://example.com/s.json"}}}, "guided_json.$ref"),
    ({"extra_body": {"structured_outputs": {"json": json.dumps({"type": "integer", "not": {"const": 0}})}}},
     "structured_outputs.json.not"),
    ({"tools": [tool(PAIR)], "tool_choice": "required"}, "tools[0].function.parameters.dependentRequired"),
    ({"tools": [tool(CODE)], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools[0].function.parameters.properties.code.maxLength"),
    ({"tools": [tool(TAGS, strict=True)]}, "tools[0].function.parameters.properties.tags.uniqueItems"),
], ids=["response_format", "guided_json", "structured_outputs", "required", "named", "strict-auto"])
def test_unenforced_keywords_are_400_naming_their_field(client, kwargs, param):
    for stream in (False, True):
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(model="llm", messages=HELLO, max_tokens=4, stream=stream, **kwargs)
        assert refused.value.body["param"] == param, refused.value.body
        assert "not enforced" in refused.value.message and "grammar compiler" in refused.value.message
