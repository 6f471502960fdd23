"""`response_format` as the llm's structured-output sampling keys: `{"type": "text"}` none,
`{"type": "json_object"}` any JSON object, `{"type": "json_schema", "json_schema": {"name", "schema",
"strict", "description"}}` JSON following the schema (always enforced: `strict` false does not loosen it).
vLLM's own keys (`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `structural_tag`,
`structured_outputs`) pass through to the llm, an object or list among them (`guided_json`, `structural_tag`,
`structured_outputs`' `json` and `structural_tag`) as its JSON text, which the llm takes for each; a
`guided_json` schema (object or text) is checked as response_format's is (tool_schema.checked). Given with
`response_format` (or a constraining `tool_choice`) they are refused naming both; they take precedence over
the soft constraint of strict tools under `auto` (tool_grammar.py). A constraint the grammar compiler refuses
comes back from the llm as 400 with its message, `param` naming the field it came from (`PARAM_WORDS`).
"""
from __future__ import annotations

import json
import re
from typing import Any

from ragstack.openai_frontend import tool_schema
from ragstack.openai_frontend.errors import APIError

GUIDED_KEYS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag",
               "structured_outputs")
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# The llm's structured-output messages begin "structured output..." (sampling_params, structured_output).
PARAM_WORDS = ("structured", "structured_outputs")


def guided_keys(extra: dict[str, Any] | None) -> list[str]:
    """vLLM's structured-output keys a request gives (its undeclared keys)."""
    return [key for key in GUIDED_KEYS if (extra or {}).get(key) is not None]


def response_format(value: Any) -> dict[str, Any]:
    """The sampling keys a response_format adds (none for text)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise APIError(400, "response_format must be an object with a 'type': 'text', 'json_object' or "
                            "'json_schema'", "response_format")
    kind = value["type"]
    unknown = sorted(set(value) - {"type", "json_schema"})
    if unknown:
        raise APIError(400, f"response_format has unknown key(s) {[k[:40] for k in unknown[:5]]}", "response_format")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"structured_outputs": {"json_object": True}}
    if kind != "json_schema":
        raise APIError(400, f"response_format.type must be 'text', 'json_object' or 'json_schema', got "
                            f"{kind[:40]!r}", "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise APIError(400, "response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"} "
                            "when type is 'json_schema'", "response_format.json_schema")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise APIError(400, f"response_format.json_schema has unknown key(s) {[k[:40] for k in unknown[:5]]}",
                       "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise APIError(400, "response_format.json_schema.name is required: 1 to 64 letters, digits, '_' or '-'",
                       "response_format.json_schema.name")
    if not isinstance(spec.get("schema"), dict):
        raise APIError(400, "response_format.json_schema.schema must be a JSON schema object",
                       "response_format.json_schema.schema")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise APIError(400, "response_format.json_schema.strict must be a boolean",
                       "response_format.json_schema.strict")
    if spec.get("description") is not None and not isinstance(spec["description"], str):
        raise APIError(400, "response_format.json_schema.description must be a string",
                       "response_format.json_schema.description")
    return {"guided_json": schema_text(tool_schema.checked(spec["schema"], "response_format.json_schema.schema"))}


def schema_text(schema: Any) -> str:
    """A schema as JSON text: the llm reads sampling_parameters nesting at most 16 deep, a schema's text
    is one string there (the frontend bounds its nesting with max_json_depth)."""
    return json.dumps(schema, ensure_ascii=False)


def constrained(body_sampling: dict[str, Any], extra: dict[str, Any] | None, response_format_value: Any,
                constraint: dict[str, Any], constraint_param: str | None,
                soft: dict[str, Any] | None = None, soft_param: str | None = None) -> tuple[dict[str, Any], str | None]:
    """The sampling keys with the one constraint the request asks for, and the request field it came
    from (for the llm's messages about it). Two sources at once are refused naming both. `soft` (auto's
    strict tools) applies only where no other constraint is asked for."""
    given = guided_keys(extra)
    sources = ([("response_format", response_format(response_format_value))]
               if response_format_value is not None else [])
    sources = [(param, keys) for param, keys in sources if keys]
    if constraint:
        sources.append((constraint_param, constraint))
    if len(given) > 1:
        raise APIError(400, f"{given[0]} and {given[1]} both constrain the output; give one", given[0])
    if sources and given:
        raise APIError(400, f"{sources[0][0]} and {given[0]} both constrain the output; give one", sources[0][0])
    if len(sources) > 1:
        raise APIError(400, f"{sources[0][0]} and {sources[1][0]} both constrain the output; give one",
                       sources[0][0])
    if sources:
        return {**body_sampling, **sources[0][1]}, sources[0][0]
    if given:
        try:
            value = _guided(given[0], extra[given[0]])
        except RecursionError:   # a text nests as deep as it likes: max_json_depth sees a string
            raise APIError(400, f"{given[0]} nests too deep to compile", given[0]) from None
        return {**body_sampling, given[0]: value}, given[0]
    if soft:
        return {**body_sampling, **soft}, soft_param
    return body_sampling, None


def _guided(key: str, value: Any) -> Any:
    """A guided key's value for the llm: its schema checked, its objects and lists as JSON text (a
    structured_outputs text goes as it came)."""
    if key == "guided_choice" and not isinstance(value, list):   # vLLM's: a list (the llm would take one string)
        raise APIError(400, f"guided_choice must be a list of strings, got {type(value).__name__}", "guided_choice")
    if key == "guided_json":
        return _schema("guided_json", value)
    if key == "structural_tag":
        return _text(value)
    if key != "structured_outputs":
        return value
    outputs = _parsed(value)
    if not isinstance(outputs, dict):
        return value   # the llm refuses it
    texts = {"json": _schema("structured_outputs.json", outputs["json"])} if "json" in outputs else {}
    if "structural_tag" in outputs:
        texts["structural_tag"] = _text(outputs["structural_tag"])
    return value if isinstance(value, str) else {**outputs, **texts}


def _schema(at: str, value: Any) -> Any:
    """A JSON schema (an object or its text) checked, as text; a text that does not parse is the llm's to refuse."""
    schema = _parsed(value)
    if isinstance(schema, dict):
        tool_schema.checked(schema, at)
    return _text(value)


def _parsed(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return None


def _text(value: Any) -> Any:
    return schema_text(value) if isinstance(value, (dict, list)) else value
