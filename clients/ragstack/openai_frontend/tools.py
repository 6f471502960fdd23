"""Tools in chat completions: `tools`, `tool_choice`, `parallel_tool_calls` checked and turned into what
the llm gets (its `tools` input, for the chat template to render; a JSON-schema constraint for
`required` and a named function) and how its answer is read (tool_parsers.py).

- `required`: the output is a JSON array (one item unless parallel_tool_calls) whose items are
  {"name": one tool's name, "parameters": that tool's parameters schema}, anyOf over the tools
  (tool_schema.py); each item becomes a tool call.
- a named function: the output is that function's arguments, under its parameters schema.
- `auto` (the default with tools): calls are read in the format of the model family's chat template
  (`--openai-tool-call-parser`, or the one the llm reads from its template: chat_tools.py's control
  request). Unconstrained, unless a tool is `strict`: then a structural tag (tool_grammar.py) keeps the
  answer free but makes every call follow the format and its tool (a strict tool's schema; any object
  for the others), OpenAI's guarantee for strict functions. It is a soft constraint: a request that
  constrains the output itself (response_format, a guided key) keeps its own, as before.
  `none`: tools are rendered, nothing is read as a call.
A tool without `parameters` takes none (`{}`). `required` and named calls always follow the schema,
strict or not.
"""
from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from ragstack.openai_frontend import tool_grammar, tool_parsers, tool_schema
from ragstack.openai_frontend import triton as t
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import LLM_JSON_DEPTH
from ragstack.openai_frontend.request_body import json_text, refuse_deeper
from ragstack.openai_frontend.structured import schema_text

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128                                     # OpenAI's; the llm's chat_tools.MAX_TOOLS
TEMPLATE_INFO_KEY = "ragstack_chat_template_info"   # backends/triton_llm/chat_tools.py
INFO_CACHE_S = 5.0                                  # as model configs: a reloaded model is seen within this
NO_PARAMETERS = tool_grammar.NO_PARAMETERS
# A call's arguments reach the llm five levels into its messages input (list, message, tool_calls, call,
# function), which nests at most LLM_JSON_DEPTH levels, scalars included.
ARGUMENTS_DEPTH = LLM_JSON_DEPTH - 6
_info: dict[str, tuple[float, dict]] = {}


@dataclass
class ToolPlan:
    tools: list[dict]           # for the llm's `tools` input
    choice: str                 # "none", "auto", "required" or "function"
    name: str | None = None     # the named function's
    parallel: bool = True
    parser: str | None = None   # auto's format (tool_parsers.AUTO), set by `resolve`
    call_format: str | None = None   # the chat template's tool-call format, set by `resolve`
    structural: bool = False    # auto's answer held by strict tools' structural tag (set by chat.py)

    def constraint(self) -> dict[str, Any]:
        """The sampling keys that constrain the output, none for auto and none."""
        if self.choice == "function":
            i = next(i for i, tool in enumerate(self.tools) if tool["function"]["name"] == self.name)
            return {"guided_json": schema_text(tool_schema.checked(self._parameters(self.name),
                                                                   f"tools[{i}].function.parameters"))}
        if self.choice != "required":
            return {}
        return {"guided_json": schema_text(tool_schema.required(self.tools, self.parallel))}

    def strict_constraint(self) -> dict[str, Any]:
        """For auto with a strict tool, once `resolve` set the format: the structural tag; else none."""
        if self.choice != "auto" or not self.parser or not any(t["function"].get("strict") for t in self.tools):
            return {}
        for i, tool in enumerate(self.tools):
            if tool["function"].get("strict"):
                tool_schema.checked(tool["function"].get("parameters") or NO_PARAMETERS,
                                    f"tools[{i}].function.parameters")
        return {"structured_outputs": {"structural_tag": tool_grammar.structural_tag(self.parser, self.tools,
                                                                                      self.parallel)}}

    def sampling(self) -> dict[str, Any]:
        """auto's sampling keys: special tokens kept in the text, as vLLM keeps them for its hermes and mistral
        parsers (Mistral's `[TOOL_CALLS]` and `[ARGS]` are special tokens, some models' `<tool_call>` too)."""
        return {"skip_special_tokens": False} if self.choice == "auto" and self.parser in ("hermes", "mistral") \
            else {}

    def reader(self) -> tool_parsers.Reader:
        short_ids = self.call_format == "mistral"   # its templates take 9-character ids only
        if self.choice == "function":
            return tool_parsers.Named(self.name, short_ids=short_ids)
        if self.choice == "required":
            return tool_parsers.Required(self.parallel, short_ids=short_ids)
        if self.choice == "auto" and self.parser:
            names = frozenset(tool["function"]["name"] for tool in self.tools)
            return tool_parsers.AUTO[self.parser](self.parallel, names=names, short_ids=short_ids,
                                                  strict=self.structural)
        return tool_parsers.Plain()

    def _parameters(self, name: str) -> dict:
        tool = next(tool for tool in self.tools if tool["function"]["name"] == name)
        return tool["function"].get("parameters") or NO_PARAMETERS


def plan(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> ToolPlan | None:
    """The request's tools checked (400 naming the field); None when it has none."""
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise APIError(400, "parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if tools is None:
        if tool_choice is not None and tool_choice != "none":
            raise APIError(400, "tool_choice needs tools: give the tools it may call", "tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise APIError(400, "tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}", "tools")
    if len(tools) > MAX_TOOLS:
        raise APIError(400, f"tools has {len(tools)} items; the limit is {MAX_TOOLS}", "tools")
    checked, names = [], set()
    for i, tool in enumerate(tools):
        function = _tool(tool, f"tools[{i}]")
        if function["name"] in names:
            raise APIError(400, f"tools[{i}].function.name {function['name']!r} is given twice",
                           f"tools[{i}].function.name")
        names.add(function["name"])
        checked.append({"type": "function", "function": function})
    choice, name = _choice(tool_choice, names)
    return ToolPlan(checked, choice, name, parallel_tool_calls is not False)


def _tool(tool: Any, at: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise APIError(400, f"{at} must be {{\"type\": \"function\", \"function\": {{\"name\", \"description\", "
                            "\"parameters\"}}", at)
    unknown = sorted(set(tool) - {"type", "function"}) or sorted(
        set(tool["function"]) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise APIError(400, f"{at} has unknown key(s) {[k[:40] for k in unknown[:5]]}", at)
    function = tool["function"]
    if not isinstance(function.get("name"), str) or not TOOL_NAME.fullmatch(function["name"]):
        raise APIError(400, f"{at}.function.name is required: 1 to 64 letters, digits, '_' or '-'",
                       f"{at}.function.name")
    for key, kind, what in (("description", str, "a string"), ("parameters", dict, "a JSON schema object"),
                            ("strict", bool, "a boolean")):
        if function.get(key) is not None and not isinstance(function[key], kind):
            raise APIError(400, f"{at}.function.{key} must be {what}", f"{at}.function.{key}")
    kind = (function.get("parameters") or {}).get("type", "object")
    if kind != "object":   # a call's arguments are an object (OpenAI refuses other roots too)
        raise APIError(400, f"{at}.function.parameters must be a JSON schema of type \"object\", got type "
                            f"{str(kind)[:40]!r}", f"{at}.function.parameters")
    # A template reads a tool's parameters (vLLM's hermes template: tool.parameters.properties): none is {}.
    return {**{key: value for key, value in function.items() if value is not None},
            "parameters": function.get("parameters") or NO_PARAMETERS}


def _choice(value: Any, names: set[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("none", "auto", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        name = value["function"]["name"]
        if name not in names:
            raise APIError(400, f"tool_choice names the function {name[:64]!r}, which is not among the tools",
                           "tool_choice")
        return "function", name
    raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}", "tool_choice")


def tool_calls_message(message: Any, at: str) -> list[dict]:
    """An assistant message's tool_calls for the llm: arguments as objects (templates write them
    with tojson), as vLLM passes them."""
    if not isinstance(message, list):
        raise APIError(400, f"{at} must be a list of tool calls", at)
    calls = []
    for j, call in enumerate(message):
        where = f"{at}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function" \
                or not isinstance(function.get("name"), str) or not function["name"]:
            raise APIError(400, f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                "\"arguments\"}}", where)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):   # JSON text inside the body's JSON
            arguments = json_text(arguments, f"{where}.function.arguments", ARGUMENTS_DEPTH) \
                if arguments.strip() else {}
        elif isinstance(arguments, dict):   # an object as it is (the body's parser checked it), within the same depth
            refuse_deeper(json.dumps(arguments).encode(), f"{where}.function.arguments", ARGUMENTS_DEPTH)
        if not isinstance(arguments, dict):
            raise APIError(400, f"{where}.function.arguments must be the JSON text of an object",
                           f"{where}.function.arguments")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise APIError(400, f"{where}.id must be a string", f"{where}.id")
        calls.append({**({"id": call["id"]} if call.get("id") is not None else {}), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


async def resolve(frontend, model: str, tool_plan: ToolPlan) -> None:
    """The tool-call format, --openai-tool-call-parser's or the one the llm's chat template names: auto's
    parser, and the form of every call's id (Mistral's are 9 characters)."""
    if tool_plan.choice == "none":
        return
    configured = frontend.limits.tool_call_parser
    if configured != "auto":
        tool_plan.call_format = configured
    elif tool_plan.choice == "auto":
        tool_plan.call_format = (await template_info(frontend.triton, model)).get("tool_call_format")
    else:   # required and named work with any llm: one that cannot say its format gets OpenAI's ids
        with contextlib.suppress(APIError):
            tool_plan.call_format = (await template_info(frontend.triton, model)).get("tool_call_format")
    if tool_plan.choice != "auto":
        return
    tool_plan.parser = tool_plan.call_format
    if tool_plan.parser not in tool_parsers.AUTO:
        raise APIError(400, f"tool_choice 'auto' reads tool calls in the format of the model's chat template, and "
                            f"model '{model}' has none this frontend knows (hermes, llama3_json, mistral); start it "
                            "with --openai-tool-call-parser, or send tool_choice 'required' or a named function",
                       "tool_choice")


async def template_info(triton, model: str) -> dict:
    """What the llm says of its chat template (its tool-call format), cached INFO_CACHE_S."""
    now = time.monotonic()
    cached = _info.get(model)
    if cached and now - cached[0] < INFO_CACHE_S:
        return cached[1]
    info: dict = {}
    async for outputs in triton.stream(model, {}, {TEMPLATE_INFO_KEY: True}):
        text = outputs.get("text_output")
        if text is not None and text.size:
            info = json.loads(text.reshape(-1)[0])
    if len(_info) > 1024:
        _info.clear()
    _info[model] = (now, info)
    return info


def llm_tools(tool_plan: ToolPlan | None) -> Any:
    """The llm's `tools` input, or None."""
    return t.text(json.dumps(tool_plan.tools, ensure_ascii=False)) if tool_plan else None
