"""The llm's chat messages and tools (backends/triton_llm/chat_tools.py): tool calls and tool results kept
for the template, arguments as objects, everything else refused naming the message or tool; the tool-call
format read from a chat template; the demo model's template renders tools and tool turns as Qwen2.5's
does, and plain chats exactly as before. Every refusal's message is one ragstack.error_codes reads as INVALID_ARG."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from chat_tools import Invalid, for_template, parse_messages, parse_tools, template_info  # noqa: E402

from ragstack.error_codes import code_from_message  # noqa: E402

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}


def test_messages_keep_names_tool_calls_and_tool_call_ids_only():
    messages = parse_messages([
        {"role": "user", "content": "hi", "name": "ann", "weight": 2},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "2", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "done", "tool_calls": []}])
    assert messages == [
        {"role": "user", "content": "hi", "name": "ann"},   # the speaker's name, as vLLM passes it
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "content": "2", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "done"}]


@pytest.mark.parametrize("messages, words", [
    ([], "non-empty JSON list"),
    ([{"role": "user"}], "messages[0] must be an object with string 'role' and 'content'"),
    ([{"role": "user", "content": "hi", "name": 3}], "messages[0].name must be a string"),
    ([{"role": "robot", "content": "x"}], "messages[0].role: 'robot' is not one of"),
    ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "only assistant messages carry tool_calls"),
    ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0] must be"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{x"}}]}], "messages[0].tool_calls[0].function.arguments is not valid"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "[1]"}}]}], "must be a JSON object"),
    ([{"role": "tool", "content": "x", "tool_call_id": 3}], "messages[0].tool_call_id must be a string"),
])
def test_bad_messages_are_named(messages, words):
    with pytest.raises(Invalid) as refused:
        parse_messages(messages)
    assert words in str(refused.value)
    assert code_from_message(f"in ensemble 'rag', {refused.value}") == "INVALID_ARG"   # read back from a gRPC stream


@pytest.mark.parametrize("tools, words", [
    ({}, "non-empty JSON list"),
    ([{"type": "function"}], "tools[0] must be"),
    ([{"type": "code_interpreter", "function": {"name": "f"}}], "tools[0] must be"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name must be a non-empty string"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "tools[0].function.parameters must be"),
    ([{"type": "function", "function": {"name": "f"}}] * 129, "the limit is 128"),
])
def test_bad_tools_are_named(tools, words):
    with pytest.raises(Invalid) as refused:
        parse_tools(tools)
    assert words in str(refused.value)
    assert code_from_message(str(refused.value)) == "INVALID_ARG"
    assert code_from_message("messages: the model's chat template refused them: roles must alternate") == "INVALID_ARG"


@pytest.mark.parametrize("template, fmt", [
    ("{% for tool in tools %}<tool_call>{% endfor %}", "hermes"),
    ("{{ '[TOOL_CALLS]' }}", "mistral"),
    ("<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}", "llama3_json"),
    ("{{ '<|start_header_id|>' }}{% if message.role == 'ipython' %}{% endif %}", "llama3_json"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
    # Qwen3-Coder's and GLM-4.5's <tool_call> hold XML, which the hermes reader would leave as content
    ("<tool_call>\n<function={{ tool_call.name }}>\n<parameter=x>\n</parameter>\n</function>\n</tool_call>", None),
    ("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>", None),
])
def test_the_tool_call_format_of_a_template(template, fmt):
    assert template_info(template)["tool_call_format"] == fmt
    assert template_info({"default": "x", "tool_use": template})["tool_call_format"] == fmt
    assert template_info(None) == {"tool_call_format": None, "renders_tools": False}


def test_the_demo_template_renders_tools_and_tool_turns():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from ragstack.tiny_checkpoints import CHAT_TEMPLATE

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    tokenizer.chat_template = CHAT_TEMPLATE

    def render(messages, tools=None):
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)

    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}]
    assert render(plain) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>assistant\n")
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    text = render(parse_messages([*plain[:2], {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                  {"role": "tool", "content": "2", "tool_call_id": "call_1"}]), tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and text.count("Be brief.") == 1
    assert '<tools>\n{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}\n</tools>' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>\n'
            "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n") in text
    assert template_info(CHAT_TEMPLATE) == {"tool_call_format": "hermes", "renders_tools": True}


MISTRAL = "{{ '[TOOL_CALLS]' }}{% if tool_call.id|length != 9 %}{{ raise_exception('ids of 9') }}{% endif %}"


def test_mistral_templates_get_call_ids_of_nine_letters_and_digits():
    """Review 16: Mistral's templates refuse OpenAI's `call_...` ids in the conversation sent back; each
    becomes 9 characters of its hash, the same in tool_calls and tool_call_id; 9-character ids stay."""
    messages = parse_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "a1B2c3D4e"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "rain"}])
    assert for_template(messages, "{{ messages }}") is messages
    shortened = for_template(messages, MISTRAL)
    first, second = (call["id"] for call in shortened[1]["tool_calls"])
    assert len(first) == 9 and first.isascii() and first.isalnum() and second == "a1B2c3D4e"
    assert [m.get("tool_call_id") for m in shortened[2:]] == [first, second]
    assert for_template(messages, MISTRAL) == shortened and messages[2]["tool_call_id"] == "call_1"
