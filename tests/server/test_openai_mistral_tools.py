"""Tool calling with a Mistral-family model through the official `openai` client (review 16): the demo
checkpoint with a Mistral-style chat template (its `[TOOL_CALLS]` format and its check that every call id
in the conversation is 9 characters) and Mistral's control tokens added as special tokens, as its
tokenizers have them. A conversation of two turns works with the ids the frontend wrote and with OpenAI's
`call_...` ids; `auto` reads a call whose `[TOOL_CALLS]` and `[ARGS]` are special tokens."""
from __future__ import annotations

import json
import shutil

import pytest
from openai import OpenAI

from ragstack.launcher import TritonServer
from server_helpers import TINY_LLM, free_server_options

pytestmark = pytest.mark.server
MODEL = "llm_mistral"
SPECIAL = ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
           "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
# Mistral v0.3's rules in a few lines: tools before the last user turn, calls after [TOOL_CALLS], and a
# refusal of any call id that is not 9 characters.
TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST]{{ message.content }}[/INST]"
    "{%- elif message.tool_calls %}[TOOL_CALLS]"
    "{%- for call in message.tool_calls %}"
    "{%- if call.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}{{ call.function.name }}[CALL_ID]{{ call.id }}[ARGS]{{ call.function.arguments|tojson }}"
    "{%- endfor %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if message.tool_call_id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings "
    "with length 9!') }}{% endif %}[TOOL_RESULTS]{{ message.tool_call_id }}: {{ message.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ message.content }}{%- endif %}"
    "{%- endfor %}")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral")
    checkpoint = root / "tiny-mistral"
    shutil.copytree(TINY_LLM, checkpoint)
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    for i, token in enumerate(SPECIAL):   # ids 500-511 are free rows of the demo model's 512-row embedding
        tokenizer["added_tokens"].append({"id": 500 + i, "content": token, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": True})
    (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    (root / "repository" / MODEL / "1").mkdir(parents=True)
    (root / "repository" / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "triton_llm"\nmax_batch_size: 0\nmodel_transaction_policy {{ decoupled: true }}\n'
        'instance_group [ { kind: KIND_MODEL, count: 1 } ]\n'
        f'parameters [ {{ key: "model", value: {{ string_value: "{checkpoint}" }} }},\n'
        '  { key: "device", value: { string_value: "cpu" } } ]\n')
    options = free_server_options(openai=True, model_repositories=[root / "repository"], models=[MODEL])
    with TritonServer(options, work_dir=root / "work") as server:
        yield OpenAI(base_url=f"{server.openai_url}/v1", api_key="unused", max_retries=0, timeout=120)


def second_turn(client, calls: list[dict]):
    """The conversation sent back with the calls and a result for each, as agents send it."""
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": calls},
                *({"role": "tool", "tool_call_id": call["id"], "content": "sunny"} for call in calls)]
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                            max_tokens=3)
    return answer.choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_two_turns_with_the_ids_the_frontend_wrote(client, stream):
    asked = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, seed=3)
    if stream:
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(stream=True, **asked):
            for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                if delta.id is not None:
                    calls[delta.index] = {"id": delta.id, "type": "function",
                                          "function": {"name": delta.function.name, "arguments": ""}}
                calls[delta.index]["function"]["arguments"] += delta.function.arguments or ""
        made = [calls[i] for i in sorted(calls)]
    else:
        made = [call.model_dump() for call in client.chat.completions.create(**asked).choices[0].message.tool_calls]
    assert made and all(len(c["id"]) == 9 and c["id"].isalnum() for c in made), made
    assert second_turn(client, made) in ("stop", "length")


def test_openai_style_ids_in_the_conversation_are_shortened_alike(client):
    calls = [{"id": "call_0123456789abcdefghijklmn", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert second_turn(client, calls) in ("stop", "length")
    rendered = client.post("/tokenize", body={"model": MODEL, "messages": [
        *ASK, {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"}], "return_token_strs": True},
        cast_to=object)
    text = client.post("/detokenize", body={"model": MODEL, "tokens": rendered["tokens"]}, cast_to=object)["prompt"]
    short = text.split("[CALL_ID]")[1][:9]
    assert short.isalnum() and f"[TOOL_RESULTS]{short}: sunny" in text


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_auto_reads_a_call_whose_markers_are_special_tokens(client, seed):
    """`[TOOL_CALLS]` and `[ARGS]` are special tokens: decoded with skip_special_tokens (the default), the call
    read `get_weather{"city": "Paris"}` and came back as content. The random model writes the call because a
    guided regex makes it."""
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=40, seed=seed,
        extra_body={"guided_regex": r'\[TOOL_CALLS\]get_weather\[ARGS\]\{"city": "Paris"\}'})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments), len(call.id)) == ("get_weather",
                                                                                         {"city": "Paris"}, 9)
