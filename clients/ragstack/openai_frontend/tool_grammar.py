"""`tool_choice: "auto"` with strict tools: an xgrammar structural tag (vLLM's `structured_outputs:
{"structural_tag": ...}`) that leaves the answer free but makes every tool call the model starts follow
its tool, in the format of the model family (tool_parsers.AUTO reads it back):

- `hermes`: free text; after `<tool_call>` a block `<tool_call>\\n{"name": "f", "arguments": ARGS}\\n</tool_call>`
  for one of the tools, then free text again (and more blocks; none after the first without parallel
  calls).
- `llama3_json`: either calls only, `{"name": "f", "parameters": ARGS}` separated by `;` (one without
  parallel calls), or content whose first character (after whitespace) is neither `{` nor `<|`, the two
  ways the reader of strict tools' answers takes one as calls (`Llama3Json(strict=True)`: at the start only).
- `mistral`: `[TOOL_CALLS]` then `[{"name": "f", "arguments": ARGS}, ...]` (or v11's `f[ARGS]ARGS`,
  several joined by `[TOOL_CALLS]`), and nothing after it; before it free text that does not start with
  `[` (the reader takes an answer starting `[{` as calls).

ARGS follows the tool's `parameters` schema when the tool is strict, and is any JSON object otherwise
(the name is still one of the tools'): OpenAI guarantees strict tools only, and a non-strict tool's
schema, which the client never asked to have enforced, cannot then fail the request by not compiling.
JSON regions are compact, as every structured output of the llm (`", "` and `": "`).
"""
from __future__ import annotations

import json
from typing import Any

ANY_OBJECT = {"type": "object"}
NO_PARAMETERS = {"type": "object", "properties": {}}
_WS = "[ \\t\\r\\n]*"


def structural_tag(parser: str, tools: list[dict], parallel: bool) -> str:
    """The structural tag's JSON text for these (checked) tools in `parser`'s format."""
    arguments = {tool["function"]["name"]: _arguments(tool["function"]) for tool in tools}
    fmt = _FORMATS[parser](arguments, parallel)
    return json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)


def _arguments(function: dict) -> dict:
    schema = (function.get("parameters") or NO_PARAMETERS) if function.get("strict") else ANY_OBJECT
    return {"type": "json_schema", "json_schema": schema}


def _tag(begin: str, content: dict, end: str) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _text(pattern: str) -> dict:
    return {"type": "regex", "pattern": pattern}


def _hermes(arguments: dict[str, dict], parallel: bool) -> dict:
    tags = [_tag(f'<tool_call>\n{{"name": "{name}", "arguments": ', args, "}\n</tool_call>")
            for name, args in arguments.items()]
    return {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags, "stop_after_first": not parallel}


def _llama3_json(arguments: dict[str, dict], parallel: bool) -> dict:
    calls = {"type": "tags_with_separator", "separator": ";", "at_least_one": True, "stop_after_first": not parallel,
             "tags": [_tag(f'{{"name": "{name}", "parameters": ', args, "}") for name, args in arguments.items()]}
    content = {"type": "sequence", "elements": [_text(_WS + "([^ \\t\\r\\n{<]|<[^|])"), {"type": "any_text"}]}
    return {"type": "or", "elements": [calls, content, _text(_WS)]}


def _mistral(arguments: dict[str, dict], parallel: bool) -> dict:
    listed = {"type": "tags_with_separator", "separator": ", ", "at_least_one": True, "stop_after_first": not parallel,
              "tags": [_tag(f'{{"name": "{name}", "arguments": ', args, "}") for name, args in arguments.items()]}
    v11_call = {"type": "or", "elements": [
        {"type": "sequence", "elements": [{"type": "const_string", "value": f"{name}[ARGS]"}, args]}
        for name, args in arguments.items()]}
    v11 = v11_call if not parallel else {"type": "sequence", "elements": [v11_call, {"type": "star", "content": {
        "type": "sequence", "elements": [{"type": "const_string", "value": "[TOOL_CALLS]"}, v11_call]}}]}
    # v0.3's own template writes "[TOOL_CALLS] [": the list may follow after a space
    calls = {"type": "or", "elements": [_tag("[", listed, "]"), _tag(" [", listed, "]"), v11]}
    after_text = {"type": "dispatch", "rules": [["[TOOL_CALLS]", calls]], "loop": False}
    return {"type": "or", "elements": [
        {"type": "sequence", "elements": [_text(_WS + "\\[TOOL_CALLS\\]"), calls]},
        {"type": "sequence", "elements": [_text(_WS + "[^ \\t\\r\\n\\[]"), after_text]},
        _text(_WS)]}


_FORMATS: dict[str, Any] = {"hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral}
