"""Tools in chat completions through the official `openai` package against the session server: the tools
reach the llm's chat template (the demo model's is Qwen2.5's Hermes format); `tool_choice` required and a
named function give tool calls whose arguments validate against the tool's schema (random model at
temperature 1: only the constraint makes them), streamed and not; `auto` reads the model family's format
(here forced by a guided regex, so the random model writes a real `<tool_call>` block) and otherwise
gives content; a conversation with tool calls and tool results is rendered; bad tools are 400 naming
the field; a frontend started with --openai-tool-call-parser llama3_json reads Llama's format."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from ragstack.launcher import free_port
from server_helpers import http_post

pytestmark = pytest.mark.server
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is 2 plus 3?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
SAMPLED = {"temperature": 1.0, "max_tokens": 160}
# A required answer has as many calls as the model writes (about 50 tokens each here; 16 seeds gave 1 to 8).
MANY = {"temperature": 1.0, "max_tokens": 800}
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)", "unit": "celsius"\}\}\n</tool_call>'


def streamed(chunks) -> tuple[str | None, list[dict], str, list]:
    """Content, tool calls assembled from the deltas (checking their shape), finish reason, chunks."""
    chunks = [c for c in chunks if c.choices]
    content, calls = None, {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        if delta.content:
            content = (content or "") + delta.content
        for call in delta.tool_calls or []:
            if call.id is not None:   # a call's first delta: id, type and name
                assert call.index not in calls and call.type == "function" and call.function.name
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            assert call.index in calls
            calls[call.index]["arguments"] += call.function.arguments or ""
    return content, [calls[i] for i in sorted(calls)], chunks[-1].choices[0].finish_reason, chunks


def check_calls(calls: list[dict], names=SCHEMAS) -> None:
    ids = set()
    for call in calls:
        assert call["id"].startswith("call_") and call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
        ids.add(call["id"])
    assert len(ids) == len(calls)


def whole_calls(message) -> list[dict]:
    assert all(call.type == "function" for call in message.tool_calls)
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]


def test_required_gives_calls_that_follow_the_tools_schemas(client):
    seen = set()
    for seed in range(3):
        [choice] = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, tool_choice="required",
                                                  seed=seed, **MANY).choices
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = whole_calls(choice.message)
        assert calls
        check_calls(calls)
        seen |= {c["name"] for c in calls}
    content, calls, reason, chunks = streamed(client.chat.completions.create(
        model="llm", messages=ASK, tools=TOOLS, tool_choice="required", seed=7, stream=True, **MANY))
    assert reason == "tool_calls" and content is None and calls
    check_calls(calls)
    assert chunks[0].choices[0].delta.role == "assistant"


def tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def required_calls(client, tools: list[dict], seed: int, **kwargs) -> list[dict]:
    [choice] = client.chat.completions.create(model="llm", messages=ASK, tools=tools, tool_choice="required",
                                              seed=seed, **kwargs).choices
    assert choice.finish_reason == "tool_calls"
    return whole_calls(choice.message)


def ordering(item: dict) -> dict:
    """Parameters with a Pydantic-style nested model: `#/$defs/Item`."""
    return {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"},
                                                       "minItems": 1, "maxItems": 2}},
            "required": ["items"], "additionalProperties": False, "$defs": {"Item": item}}


def test_required_takes_tools_defining_one_name_differently(client):
    """Each tool's `$ref`s resolve in its own parameters (LlamaIndex sends two Pydantic models each nesting
    an `Item`): both tools are called in one answer, each following its own `Item`."""
    schemas = {"order": ordering({"type": "object", "properties": {"sku": {"type": "string", "maxLength": 6}},
                                  "required": ["sku"], "additionalProperties": False}),
               "restock": ordering({"type": "object", "properties": {"count": {"type": "integer", "minimum": 1,
                                                                               "maximum": 9}},
                                    "required": ["count"], "additionalProperties": False})}
    calls = required_calls(client, [tool(name, schema) for name, schema in schemas.items()], seed=1, **MANY)
    assert {call["name"] for call in calls} == set(schemas)
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def test_required_takes_draft_07_definitions(client):
    """zod-to-json-schema (LangChain.js, the Vercel AI SDK), Pydantic v1 and many MCP servers refer to
    `#/definitions/...`."""
    town = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"street": {"$ref": "#/definitions/Street"}}, "required": ["street"],
            "additionalProperties": False, "definitions": {"Street": {
                "type": "object", "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["number"], "additionalProperties": False}}}
    [call] = required_calls(client, [tool("town", town)], seed=1, parallel_tool_calls=False, **SAMPLED)
    jsonschema.validate(json.loads(call["arguments"]), town)


def test_required_takes_the_root_reference_and_json_pointers(client):
    """`#` is the tool's own parameters (a linked list), not the array of calls; `#/properties/a` points
    into them."""
    linked = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
              "required": ["v", "next"], "additionalProperties": False}
    [call] = required_calls(client, [tool("linked", linked)], seed=1, parallel_tool_calls=False,
                            temperature=1.0, max_tokens=240)
    arguments = json.loads(call["arguments"])
    jsonschema.validate(arguments, linked)
    assert isinstance(arguments["next"], dict)   # seed 1 nests: the reference was followed, into an object
    pair = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                             "b": {"$ref": "#/properties/a"}},
            "required": ["a", "b"], "additionalProperties": False}
    [call] = required_calls(client, [tool("pair", pair)], seed=1, parallel_tool_calls=False, **SAMPLED)
    jsonschema.validate(json.loads(call["arguments"]), pair)


def test_parallel_tool_calls_false_gives_one_call(client):
    for seed, stream in ((11, False), (12, True)):
        answer = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, seed=seed, stream=stream, **SAMPLED)
        calls = streamed(answer)[1] if stream else whole_calls(answer.choices[0].message)
        assert len(calls) == 1
        check_calls(calls)


def test_a_named_function_is_the_one_called(client):
    choice = {"type": "function", "function": {"name": "add"}}
    [whole] = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, tool_choice=choice, seed=1,
                                             **SAMPLED).choices
    [call] = whole_calls(whole.message)
    assert call["name"] == "add" and whole.finish_reason == "stop" and whole.message.content is None   # OpenAI's
    check_calls([call], {"add"})
    content, calls, reason, chunks = streamed(client.chat.completions.create(
        model="llm", messages=ASK, tools=TOOLS, tool_choice=choice, seed=2, stream=True, **SAMPLED))
    assert [c["name"] for c in calls] == ["add"] and reason == "stop" and content is None
    check_calls(calls, {"add"})
    assert sum(1 for c in chunks for call in c.choices[0].delta.tool_calls or [] if call.function.arguments) > 1


def test_auto_reads_the_hermes_format_of_the_template(client):
    """The demo model's template is Qwen2.5's: a `<tool_call>` block (here forced by a regex) is a call."""
    [choice] = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, seed=3,
                                              extra_body={"guided_regex": "Sure\\.\\n" + HERMES_CALL},
                                              **SAMPLED).choices
    [call] = whole_calls(choice.message)
    assert call["name"] == "get_weather" and choice.message.content == "Sure."
    assert choice.finish_reason == "tool_calls"
    check_calls([call])
    content, calls, reason, _ = streamed(client.chat.completions.create(
        model="llm", messages=ASK, tools=TOOLS, tool_choice="auto", seed=4, stream=True,
        extra_body={"guided_regex": HERMES_CALL}, **SAMPLED))
    assert [c["name"] for c in calls] == ["get_weather"] and reason == "tool_calls" and content is None
    check_calls(calls)


def test_auto_with_text_gives_content_and_none_reads_no_calls(client):
    for tool_choice, extra in (("auto", {}), ("none", {"guided_regex": HERMES_CALL})):
        [choice] = client.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                                  temperature=0, max_tokens=12, extra_body=extra).choices
        assert choice.message.content and not choice.message.tool_calls and choice.finish_reason != "tool_calls"
        content, calls, reason, _ = streamed(client.chat.completions.create(
            model="llm", messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=12,
            stream=True, extra_body=extra))
        assert content == choice.message.content and not calls and reason == choice.finish_reason


def test_tools_and_tool_results_reach_the_chat_template(client):
    def prompt_tokens(messages, **kwargs) -> int:
        return client.chat.completions.create(model="llm", messages=messages, max_tokens=1, **kwargs).usage.prompt_tokens

    plain = prompt_tokens(ASK)
    assert prompt_tokens(ASK, tools=TOOLS) > plain + 50   # the template lists the tools' signatures
    assert prompt_tokens(ASK, tools=TOOLS, tool_choice="none") == prompt_tokens(ASK, tools=TOOLS)
    conversation = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"}]
    answered = client.chat.completions.create(model="llm", messages=conversation, tools=TOOLS, temperature=0,
                                              max_tokens=6)
    longer = [*conversation[:-1], {**conversation[-1], "content": "5, and that is the sum of two and three"}]
    assert prompt_tokens(longer, tools=TOOLS) > answered.usage.prompt_tokens > plain
    assert answered.choices[0].message.content is not None


def test_the_llm_takes_tools_beside_messages_over_http_generate(triton_server):
    messages = json.dumps(ASK)
    status, body = http_post(triton_server.http_url, "/v2/models/llm/generate",
                             {"messages": messages, "tools": json.dumps(TOOLS), "parameters": {"max_tokens": 2}})
    assert status == 200, body
    status, body = http_post(triton_server.http_url, "/v2/models/llm/generate",
                             {"text_input": "hi", "tools": json.dumps(TOOLS), "parameters": {"max_tokens": 2}})
    assert status == 400 and "input 'tools' needs 'messages'" in body, body
    status, body = http_post(triton_server.http_url, "/v2/models/llm/generate",
                             {"messages": messages, "tools": '[{"type": "function"}]', "parameters": {"max_tokens": 2}})
    assert status == 400 and "tools[0] must be" in body, body


BAD = [
    ({"tools": {"name": "f"}}, "tools", "must be a non-empty list"),
    ({"tools": []}, "tools", "must be a non-empty list"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name", "is required"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "must be {"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools[0].function.parameters",
     "must be a JSON schema object"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name", "is given twice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "must be 'none', 'auto', 'required'"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "response_format and tool_choice both constrain the output"),
    ({"tools": TOOLS, "tool_choice": "required", "extra_body": {"guided_choice": ["a"]}}, "tool_choice",
     "tool_choice and guided_choice both constrain the output"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "tool_choice", 'Unsupported type "nonsense"'),
    ({"tools": [*TOOLS, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#p"}, "q": {"$anchor": "p", "type": "integer"}}}}}],
      "tool_choice": "required"}, "tools[2].function.parameters", "'#p' at /properties/p/$ref, a reference by anchor"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "p": {"$id": "https://example.com/p", "properties": {"q": {"$ref": "#/$defs/Q"}}, "$defs": {"Q": {}}}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "under the $id at /properties/p"),
    # compiled whole (a named tool, a strict tool under auto), an anchor would be any value: refused as well
    ({"tools": [*TOOLS, {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#p"}, "q": {"$anchor": "p", "type": "integer"}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools[2].function.parameters",
     "a reference by anchor"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#p"}}, "$defs": {"P": {"$anchor": "p"}}}}}]},
     "tools[0].function.parameters", "a reference by anchor"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "is not valid JSON"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
     "messages[1].tool_calls[0]", "must be {"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[0].tool_calls", "only assistant messages carry tool calls"),
]


@pytest.mark.parametrize("kwargs, param, message", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_tools_are_400_naming_the_field(client, kwargs, param, message):
    kwargs = {"messages": ASK, **kwargs}
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="llm", max_tokens=4, **kwargs)
    assert refused.value.body["param"] == param and message in refused.value.message, refused.value.body


def test_tools_only_for_an_llm_in_chat(client):
    with pytest.raises(BadRequestError) as refused:
        client.completions.create(model="llm", prompt="hi", max_tokens=2, extra_body={"tools": TOOLS})
    assert refused.value.body["param"] == "tools" and "for chat completions" in refused.value.message
    with pytest.raises(BadRequestError) as refused:
        client.chat.completions.create(model="rag", messages=ASK, tools=TOOLS, max_tokens=2)
    assert refused.value.body["param"] == "tools" and "not available from model 'rag'" in refused.value.message


@pytest.fixture(scope="module")
def llama3_frontend(triton_server, tmp_path_factory):
    """A second frontend on the session server, told to read tool calls in Llama 3.1's JSON format."""
    port = free_port()
    log = (tmp_path_factory.mktemp("frontend") / "openai.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "ragstack.openai_frontend", "--listen", f"127.0.0.1:{port}",
                                "--triton", triton_server.grpc_url, "--openai-tool-call-parser", "llama3_json"],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "the second frontend did not start"
            time.sleep(0.1)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def test_the_tool_call_parser_flag_reads_llama3_json(llama3_frontend):
    call = r'\{"name": "add", "parameters": \{"a": [1-9], "b": [1-9]\}\}'
    with OpenAI(base_url=f"{llama3_frontend}/v1", api_key="unused", max_retries=0, timeout=120) as other:
        [choice] = other.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, seed=5,
                                                 extra_body={"guided_regex": call}, **SAMPLED).choices
        [found] = whole_calls(choice.message)
        assert found["name"] == "add" and choice.message.content is None and choice.finish_reason == "tool_calls"
        check_calls([found])
        content, calls, reason, _ = streamed(other.chat.completions.create(
            model="llm", messages=ASK, tools=TOOLS, seed=6, stream=True, extra_body={"guided_regex": call},
            **SAMPLED))
        assert [c["name"] for c in calls] == ["add"] and content is None and reason == "tool_calls"
        # Llama's calls are read wherever they begin (as vLLM's parser finds them; the guided regex, not strict
        # tools' tag, holds this answer): a Hermes block's call is read too, its tags left as content, and the
        # call of a tool not given stays content.
        [choice] = other.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, seed=5,
                                                 extra_body={"guided_regex": HERMES_CALL}, **SAMPLED).choices
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
        assert choice.message.content == "<tool_call>\n</tool_call>"
        [choice] = other.chat.completions.create(model="llm", messages=ASK, tools=TOOLS, seed=5, extra_body={
            "guided_regex": HERMES_CALL.replace("get_weather", "get_time")}, **SAMPLED).choices
        assert choice.message.content.startswith("<tool_call>") and not choice.message.tool_calls
