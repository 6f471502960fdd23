"""The llm's request parser (backends/triton_llm/llm_request.py) on its `chat_template_kwargs` input: vLLM's chat
template arguments checked and resolved for Tokenizer.apply_chat_template, every refusal naming the input and
the key, in words ragstack.error_codes reads as INVALID_ARG."""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from chat_template_kwargs import RESERVED  # noqa: E402
from llm_request import INPUTS, MAX_JSON_BYTES, InvalidRequest, parse_request  # noqa: E402

from ragstack.error_codes import code_from_message  # noqa: E402

CHAT = [{"role": "user", "content": "Hi"}]
PREFILL = [*CHAT, {"role": "assistant", "content": "Once upon"}]


def parse(messages=CHAT, kwargs=None, text=None, raw=None):
    tensors = {}
    if messages is not None:
        tensors["messages"] = np.array([json.dumps(messages).encode()], dtype=np.object_)
    if text is not None:
        tensors["text_input"] = np.array([text.encode()], dtype=np.object_)
    if kwargs is not None or raw is not None:
        raw = raw if raw is not None else json.dumps(kwargs).encode()
        tensors["chat_template_kwargs"] = np.array([raw], dtype=np.object_)
    return parse_request(tensors.get, "", 1 << 20)


def test_the_input_is_declared_as_a_string_of_one():
    [tensor] = [t for t in INPUTS if t["name"] == "chat_template_kwargs"]
    assert tensor == {"name": "chat_template_kwargs", "data_type": "TYPE_STRING", "dims": [1], "optional": True}


@pytest.mark.parametrize("kwargs, resolved", [
    (None, {}),
    ({}, {"add_generation_prompt": True, "continue_final_message": False}),
    ({"add_generation_prompt": False}, {"add_generation_prompt": False, "continue_final_message": False}),
    ({"add_generation_prompt": None, "continue_final_message": None, "documents": None},
     {"add_generation_prompt": True, "continue_final_message": False}),
    ({"enable_thinking": False, "reasoning_effort": "low", "bos_token": "<s>"},
     {"enable_thinking": False, "reasoning_effort": "low", "bos_token": "<s>", "add_generation_prompt": True,
      "continue_final_message": False}),
    ({"documents": [{"title": "T", "text": "x"}, {}]},
     {"documents": [{"title": "T", "text": "x"}, {}], "add_generation_prompt": True, "continue_final_message": False}),
    ({"documents": []}, {"documents": [], "add_generation_prompt": True, "continue_final_message": False}),
])
def test_accepted_kwargs_resolve_to_apply_chat_templates_arguments(kwargs, resolved):
    assert parse(kwargs=kwargs).chat_template_kwargs == resolved


@pytest.mark.parametrize("add_generation_prompt", [None, False])
def test_continuing_the_last_assistant_message_adds_no_generation_prompt(add_generation_prompt):
    kwargs = {"continue_final_message": True, "add_generation_prompt": add_generation_prompt}
    assert parse(PREFILL, kwargs).chat_template_kwargs == {"add_generation_prompt": False,
                                                           "continue_final_message": True}


@pytest.mark.parametrize("messages, kwargs, words", [
    (CHAT, [1], "input 'chat_template_kwargs' must be a JSON object, got list"),
    (CHAT, "x", "input 'chat_template_kwargs' must be a JSON object, got str"),
    (CHAT, {"tools": []}, "key 'tools' is an argument of apply_chat_template itself, not a template variable: "
                          "give tools as the 'tools' input"),
    (CHAT, {"tokenize": True}, "key 'tokenize' is an argument of apply_chat_template itself"),
    (CHAT, {"messages": []}, "key 'messages' is an argument of apply_chat_template itself"),
    (CHAT, {"chat_template": "{{ 1 }}"}, "key 'chat_template' is an argument"),
    (CHAT, {"add_generation_prompt": "true"}, "key 'add_generation_prompt' must be true or false, got 'true'"),
    (CHAT, {"continue_final_message": 1}, "key 'continue_final_message' must be true or false, got 1"),
    (PREFILL, {"continue_final_message": True, "add_generation_prompt": True},
     "Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
    (CHAT, {"continue_final_message": True, "add_generation_prompt": False},
     "key 'continue_final_message' needs the last message to be an assistant message; messages[0] is a 'user' "
     "message"),
    (CHAT, {"documents": {"title": "T"}}, "key 'documents' must be a list of JSON objects, got dict"),
    (CHAT, {"documents": [{"text": "x"}, "y"]}, "documents[1] must be a JSON object, got str"),
])
def test_refusals_name_the_input_and_the_key(messages, kwargs, words):
    with pytest.raises(InvalidRequest) as refused:
        parse(messages, kwargs)
    message = str(refused.value)
    assert words in message and message.startswith("input 'chat_template_kwargs' "), message
    assert code_from_message(f"in ensemble 'rag', {message}") == "INVALID_ARG"


@pytest.mark.parametrize("raw, words", [
    (b"{not json", "input 'chat_template_kwargs' is not valid JSON"),
    (b'{"a": 1, "a": 2}', "input 'chat_template_kwargs' has the key 'a' more than once"),
    (b'{"a": NaN}', "input 'chat_template_kwargs' has NaN"),
    (b'{"a": ["\\ud800"]}', "input 'chat_template_kwargs' has a lone surrogate escape"),
    (b'{"\\udfff": 1}', "input 'chat_template_kwargs' has a lone surrogate escape"),
    (b"\xff", "input 'chat_template_kwargs' is not valid UTF-8"),
    (b'{"a": "' + b"x" * MAX_JSON_BYTES + b'"}', f"the limit is {MAX_JSON_BYTES}"),
])
def test_bad_json_is_refused_as_the_other_json_inputs_are(raw, words):
    with pytest.raises(InvalidRequest, match="input 'chat_template_kwargs' ") as refused:
        parse(raw=raw)
    assert words in str(refused.value)


def test_kwargs_without_messages_are_refused_as_tools_without_messages():
    with pytest.raises(InvalidRequest) as refused:
        parse(messages=None, text="Hi", kwargs={"add_generation_prompt": False})
    assert str(refused.value) == "input 'chat_template_kwargs' needs 'messages': the chat template renders them"


def test_the_reserved_names_cover_transformers_apply_chat_template():
    """Every argument of the installed transformers' apply_chat_template, but the three keys the input sets and
    its **kwargs (the template variables), is refused as a key."""
    from transformers import PreTrainedTokenizerBase

    parameters = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters
    own = {name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert own - {"add_generation_prompt", "continue_final_message", "documents"} <= RESERVED
    for name in sorted(RESERVED):
        with pytest.raises(InvalidRequest, match=f"key '{name}' is an argument of apply_chat_template"):
            parse(kwargs={name: None})
