"""Constrained output at its edges, through the session server's frontend (raw HTTP, so non-standard JSON would
show): logprobs of tokens a constraint masks are vLLM's floor, not -Infinity; a constraint with no way on is a
400 naming its field, not a 500; a tool whose parameters are not an object schema is refused up front; a
required call that a stop string cut ends with `stop`, not `tool_calls`; `guided_choice` is a list, as vLLM's."""
from __future__ import annotations

import json

import httpx2 as httpx
import pytest

pytestmark = pytest.mark.server
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.openai_url}{path}", json=body, timeout=120)


def strict_json(text: str):
    """JSON as a strict parser reads it: -Infinity, Infinity and NaN are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def logprob_values(answer: dict) -> list[float]:
    """Every logprob of a chat or completions answer (or chunk), alternatives included."""
    values = []
    for choice in answer["choices"]:
        logprobs = choice.get("logprobs") or {}
        for entry in logprobs.get("content") or []:   # chat
            values += [entry["logprob"], *(top["logprob"] for top in entry["top_logprobs"])]
        values += [v for v in logprobs.get("token_logprobs") or [] if v is not None]   # completions
        values += [v for top in logprobs.get("top_logprobs") or [] if top for v in top.values()]
    return values


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_of_masked_tokens_are_vllm_s_floor(triton_server, stream):
    chat = {"model": "llm", "messages": ASK, "max_tokens": 4, "logprobs": True, "top_logprobs": 5,
            "guided_choice": ["yes", "no"], "stream": stream}
    completion = {"model": "llm", "prompt": "Answer:", "max_tokens": 4, "logprobs": 5, "guided_choice": ["yes", "no"],
                  "stream": stream}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
        answer = post(triton_server, path, body)
        assert answer.status_code == 200, answer.text
        bodies = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"] \
            if stream else [answer.text]
        values = [v for text in bodies for v in logprob_values(strict_json(text))]
        assert values and min(values) == -9999.0, (path, values)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "loop", "schema": {"$ref": "#"}}}},
     "response_format"),
    ({"guided_grammar": "root ::= root"}, "guided_grammar"),
    ({"guided_regex": "[^\\s\\S]"}, "guided_regex"),
])
def test_a_constraint_with_no_way_on_is_a_400_naming_it(triton_server, extra, param, stream):
    answer = post(triton_server, "/v1/chat/completions",
                  {"model": "llm", "messages": ASK, "max_tokens": 8, "stream": stream, **extra})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and "the constraint allows no token after 0 generated" in error["message"]


@pytest.mark.parametrize("parameters, kind", [({"type": "array", "items": {"type": "integer"}}, "array"),
                                              ({"type": "string"}, "string")])
def test_tool_parameters_must_be_an_object_schema(triton_server, parameters, kind):
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    answer = post(triton_server, "/v1/chat/completions",
                  {"model": "llm", "messages": ASK, "tools": [tool], "tool_choice": "required"})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "tools[0].function.parameters"
    assert f'must be a JSON schema of type "object", got type \'{kind}\'' in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_cut_by_a_stop_string_ends_with_stop(triton_server, stream):
    body = {"model": "llm", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "stop": ['"parameters"'],
            "parallel_tool_calls": False, "temperature": 0, "max_tokens": 200, "stream": stream}
    answer = post(triton_server, "/v1/chat/completions", body)
    assert answer.status_code == 200, answer.text
    if stream:
        chunks = [json.loads(line[6:]) for line in answer.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        reasons = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
        stops = [c["stop_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    else:
        choice = answer.json()["choices"][0]
        reasons, stops = [choice["finish_reason"]], [choice["stop_reason"]]
    assert reasons == ["stop"] and stops == ['"parameters"']
    whole = post(triton_server, "/v1/chat/completions", {**body, "stop": None, "stream": False}).json()
    assert whole["choices"][0]["finish_reason"] == "tool_calls"


def test_guided_choice_must_be_a_list(triton_server):
    answer = post(triton_server, "/v1/chat/completions",
                  {"model": "llm", "messages": ASK, "max_tokens": 4, "guided_choice": "yes"})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "guided_choice"
    assert error["message"] == "guided_choice must be a list of strings, got str"
