"""Chat messages and tools as the chat template takes them, and the tool-call format a template uses.

`messages` is a JSON list of {"role", "content"} objects; an assistant message may carry
`tool_calls` (OpenAI's shape: [{"id", "type": "function", "function": {"name", "arguments"}}], its
content then optional) and a tool message its `tool_call_id`. `arguments` may be an object or its
JSON text (OpenAI sends text): templates write it with `tojson`, so it reaches them as an object,
as vLLM passes it. The optional `tools` input is a JSON list of OpenAI tools
([{"type": "function", "function": {"name", "description", "parameters"}}]) handed to the template
(`apply_chat_template(messages, tools=...)`), which renders them in the model's own words; a
template that does not mention tools ignores them, as with vLLM. A message's `name` (a string)
reaches the template too, as vLLM passes it (templates that know it write the speaker's name).
Other keys of a message are dropped: they could steer the template.

The tool-call format (`tool_call_format`) is read from the template text: Qwen2.5/Hermes
`<tool_call>` blocks, Mistral's `[TOOL_CALLS]`, Llama 3.1+'s JSON (`<|python_tag|>` / `ipython`).
The OpenAI frontend asks for it (a control request, TEMPLATE_INFO_KEY) to parse `tool_choice: auto`.
"""
from __future__ import annotations

import hashlib
import json
import string
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
# A control request (no inputs, this request parameter): answered with one FINAL response whose
# text_output is {"tool_call_format": "hermes" | "mistral" | "llama3_json" | null, "renders_tools": bool}.
TEMPLATE_INFO_KEY = "ragstack_chat_template_info"
MAX_TOOLS = 128
ID_CHARACTERS = string.ascii_letters + string.digits


class Invalid(ValueError):
    """What is wrong, naming the message or tool."""


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated messages for the template: role, content (a string), name, tool_calls, tool_call_id."""
    if not isinstance(messages, list) or not messages:
        raise Invalid("input 'messages' must be a non-empty JSON list of {\"role\", \"content\"} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise Invalid(f"messages[{i}] must be an object with string 'role' and 'content'")
        role = message["role"]
        if role not in ROLES:
            raise Invalid(f"messages[{i}].role: {role[:40]!r} is not one of {list(ROLES)}")
        calls = message.get("tool_calls") or None   # [] as none, as clients send it
        content = message.get("content")
        if calls is not None and role != "assistant":
            raise Invalid(f"messages[{i}].tool_calls: only assistant messages carry tool_calls, not {role!r}")
        if not isinstance(content, str) and not (calls and content is None):
            raise Invalid(f"messages[{i}] must be an object with string 'role' and 'content'")
        kept: dict[str, Any] = {"role": role, "content": content or ""}
        if message.get("name") is not None:
            if not isinstance(message["name"], str):
                raise Invalid(f"messages[{i}].name must be a string")
            kept["name"] = message["name"]
        if calls is not None:
            kept["tool_calls"] = _tool_calls(calls, f"messages[{i}].tool_calls")
        if role == "tool" and message.get("tool_call_id") is not None:
            if not isinstance(message["tool_call_id"], str):
                raise Invalid(f"messages[{i}].tool_call_id must be a string")
            kept["tool_call_id"] = message["tool_call_id"]
        out.append(kept)
    return out


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise Invalid(f"{where} must be a list of tool calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise Invalid(f"{at} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
        if call.get("type", "function") != "function":
            raise Invalid(f"{at}.type must be 'function'")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise Invalid(f"{at}.function.arguments is not valid JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise Invalid(f"{at}.function.arguments must be a JSON object (or its text)")
        kept = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if call.get("id") is not None:
            if not isinstance(call["id"], str):
                raise Invalid(f"{at}.id must be a string")
            kept["id"] = call["id"]
        out.append(kept)
    return out


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI tools, checked: a non-empty list of functions with a name and an object for parameters."""
    if not isinstance(tools, list) or not tools:
        raise Invalid("input 'tools' must be a non-empty JSON list of {\"type\": \"function\", \"function\": {...}}")
    if len(tools) > MAX_TOOLS:
        raise Invalid(f"input 'tools' has {len(tools)} tools; the limit is {MAX_TOOLS}")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise Invalid(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise Invalid(f"tools[{i}].function.name must be a non-empty string")
        for key, kind in (("description", str), ("parameters", dict)):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise Invalid(f"tools[{i}].function.{key} must be a{'n object' if kind is dict else ' string'}")
        out.append({"type": "function", "function": {k: v for k, v in function.items()
                                                     if k in ("name", "description", "parameters", "strict")}})
    return out


def tool_call_format(template: str) -> str | None:
    """The tool-call format a chat template teaches its model: the frontend's parser for it. `<tool_call>`
    holding XML (Qwen3-Coder's `<function=...>`, GLM-4.5's `<arg_key>`) is none of them."""
    if "<tool_call>" in template:
        return None if "<function=" in template or "<arg_key>" in template else "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "ipython" in template):
        return "llama3_json"
    return None


def template_info(template: str | dict | None) -> dict[str, Any]:
    """What TEMPLATE_INFO_KEY answers; named templates (e.g. "default" and "tool_use") count together."""
    text = _text(template)
    return {"tool_call_format": tool_call_format(text), "renders_tools": "tools" in text}


def for_template(messages: list[dict[str, Any]], template: str | dict | None) -> list[dict[str, Any]]:
    """The messages as the template takes them: Mistral's refuse a call id that is not 9 letters and digits
    (OpenAI's `call_...`, another model's), so such an id becomes 9 characters of its hash, the same in the
    assistant's tool_calls and the tool message's tool_call_id (vLLM keeps the last 9 characters)."""
    if tool_call_format(_text(template)) != "mistral":
        return messages
    out = []
    for message in messages:
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [{**call, "id": _short_id(call["id"])} if "id" in call else call
                                     for call in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = _short_id(message["tool_call_id"])
        out.append(message)
    return out


def _short_id(call_id: str) -> str:
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    digest = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(ID_CHARACTERS[(digest // 62 ** i) % 62] for i in range(9))


def _text(template: str | dict | None) -> str:
    return "\n".join(str(t) for t in template.values()) if isinstance(template, dict) else template or ""
