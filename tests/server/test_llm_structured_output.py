"""Structured output through `llm` on the real server: vLLM's guided_* sampling keys and its
structured_outputs object (vllm_backend passes it as JSON text), over HTTP generate and gRPC; a bad
constraint is INVALID_ARG naming the problem."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from llm_streams import Collected, StreamSession, llm_inputs
from server_helpers import http_post

pytestmark = pytest.mark.server
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 20},
                                           "sources": {"type": "array", "items": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 5}, "maxItems": 3}},
          "required": ["answer", "sources"], "additionalProperties": False}


def generate(url: str, **parameters) -> tuple[int, dict]:
    status, body = http_post(url, "/v2/models/llm/generate",
                             {"text_input": "Reply:", "parameters": {"max_tokens": 160, "temperature": 1.0,
                                                                     "exclude_input_in_output": True, **parameters}})
    return status, json.loads(body)


@pytest.mark.parametrize("seed", range(3))
def test_guided_json_answers_validate(triton_server, seed):
    status, body = generate(triton_server.http_url, seed=seed, guided_json=SCHEMA)
    assert status == 200, body
    jsonschema.validate(json.loads(body["text_output"]), SCHEMA)


@pytest.mark.parametrize("parameters, check", [
    ({"guided_regex": r"[A-Z]{2}\d{3}"}, lambda text: re.fullmatch(r"[A-Z]{2}\d{3}", text)),
    ({"guided_choice": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
    ({"guided_choice": '["left", "right"]'}, lambda text: text in ("left", "right")),  # JSON text, as strings go
    ({"guided_grammar": 'root ::= "x" [0-9] [0-9]'}, lambda text: re.fullmatch(r"x\d\d", text)),
    ({"guided_json": json.dumps(SCHEMA), "guided_decoding_backend": "xgrammar"},
     lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
    ({"structured_outputs": {"json_object": True}}, lambda text: isinstance(json.loads(text), dict)),
], ids=["regex", "choice", "choice-json-text", "grammar", "json-text", "json-object"])
def test_each_guided_key_is_followed(triton_server, parameters, check):
    status, body = generate(triton_server.http_url, **parameters, max_tokens=256)
    assert status == 200, body
    assert check(body["text_output"]), body["text_output"]


def grpc_stream(url: str, sampling: dict) -> Collected:
    session = StreamSession(url)
    try:
        collected = session.send("r", llm_inputs("Reply:", stream=False, sampling=sampling,
                                                 extra={"exclude_input_in_output": (True, "BOOL")}))
        session.wait_all()
    finally:
        session.close()
    return collected


def test_vllm_backend_clients_structured_outputs_json_text_over_grpc(triton_server):
    """vllm_backend reads sampling_parameters' structured_outputs as the JSON text of vLLM's
    StructuredOutputsParams."""
    sampling = {"temperature": "0.7", "max_tokens": "32",
                "structured_outputs": json.dumps({"regex": "(cat|dog)s?", "disable_fallback": True})}
    collected = grpc_stream(triton_server.grpc_url, sampling)
    assert not collected.errors and re.fullmatch("(cat|dog)s?", collected.text), collected


@pytest.mark.parametrize("parameters, message", [
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
     'the json constraint is invalid: Unsupported type "nonsense"'),
    ({"guided_json": "{not json"}, "structured output json is not valid JSON"),
    ({"guided_regex": "(["}, "the regex constraint is invalid: Regex parsing error at position 3: Unclosed '['"),
    ({"guided_grammar": "root ::= x"}, 'Rule "x" is not defined'),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "takes exactly one of json, json_object, regex, choice, "
                                                   "grammar, structural_tag; got ['regex', 'choice']"),
    ({"structured_outputs": "{oops"}, "'structured_outputs' is not a valid JSON object"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured output structural_tag is not valid JSON"),
    ({"structural_tag": '{"type": "structural_tag", "format": {"type": "nope"}}'},
     "the structural_tag constraint is invalid: Invalid structural tag error: Format type not recognized: nope"),
    ({"structured_outputs": {"jsn": "{}"}}, "unknown structured output key(s) ['jsn']"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "uses xgrammar only"),
    ({"guided_whitespace_pattern": " "}, "'guided_whitespace_pattern' is a vLLM sampling parameter this engine "
                                         "does not implement"),
])
def test_a_bad_constraint_is_invalid_arg_naming_it(triton_server, parameters, message):
    status, body = generate(triton_server.http_url, **parameters)
    assert status == 400 and message in body["error"], body
    collected = grpc_stream(triton_server.grpc_url, parameters)  # a stream's errors carry no code in 2.51
    assert len(collected.errors) == 1 and message in collected.errors[0], collected.errors
