"""`tool_choice: "auto"` with a strict tool, through the official `openai` package: the frontend sends the
llm a structural tag in the model's format (the demo model's is Hermes), so the answer stays free text
(streamed and whole) and any call in it follows its tool; a strict tool whose schema does not compile is
400 naming `tools`, while without a strict tool nothing is constrained (the same schema passes, as
before); a constraint of the request's own (response_format) keeps precedence. That calls made under the
tag validate is checked on the engine (tests/engine/test_structural_tag_tool_calls.py), where the random
model can be made to call."""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai import BadRequestError
from test_openai_tools import ASK, SCHEMAS, TOOLS, streamed, whole_calls

pytestmark = pytest.mark.server
SAMPLED = {"temperature": 1.0, "max_tokens": 24}
BROKEN = {"type": "object", "properties": {"a": {"type": "nonsense"}}}


def test_auto_with_a_strict_tool_answers_free_text_and_valid_calls(client):
    assert any(tool["function"].get("strict") for tool in TOOLS)
    for seed in range(3):
        [choice] = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, seed=seed,
                                                  **SAMPLED).choices
        for call in whole_calls(choice.message) if choice.message.tool_calls else []:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        assert choice.message.content or choice.message.tool_calls
    content, calls, reason, _ = streamed(client.chat.completions.create(
        model="llm", messages=ASK, tools=TOOLS, tool_choice="auto", seed=3, stream=True, **SAMPLED))
    assert (content or calls) and reason in ("stop", "length", "tool_calls")
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_a_strict_tool_that_does_not_compile_is_400_naming_tools(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": BROKEN, "strict": True}}]
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="llm", messages=ASK, tools=tools, max_tokens=4)
    assert refused.value.body["param"] == "tools", refused.value.body
    assert "the structural_tag constraint is invalid: " in refused.value.message
    assert 'Unsupported type "nonsense"' in refused.value.message
    # Not strict: auto constrains nothing, and the schema is the client's to check (OpenAI's words).
    [choice] = client.chat.completions.create(model="llm", messages=ASK, max_tokens=4,
                                              tools=[{"type": "function", "function": {
                                                  "name": "f", "parameters": BROKEN}}]).choices
    assert choice.finish_reason == "length"


def test_the_requests_own_constraint_keeps_precedence(client):
    [choice] = client.chat.completions.create(
        model="llm", messages=ASK, tools=TOOLS, seed=1, temperature=1.0, max_tokens=60,
        extra_body={"guided_regex": "(yes|no)"}).choices
    assert choice.message.content in ("yes", "no") and not choice.message.tool_calls
