"""`tool_choice: "required"`'s schema: a JSON array (at most one item without parallel calls) of
{"name": one tool's name, "parameters": that tool's parameters}, anyOf over the tools, as vLLM builds it.

Each tool's parameters sit whole at the root's `$defs["__tool_<i>"]` and the item refers to them, so
their local references keep their meaning nested in the array: `"#"` becomes `"#/$defs/__tool_<i>"` and
`"#/<pointer>"` becomes `"#/$defs/__tool_<i>/<pointer>"` (`$defs`, draft-07's `definitions`, any pointer;
a definition referring to another is rewritten too), and each tool keeps its own names. References that
do not start with `#` are left to the grammar compiler, as in every other schema the llm gets. What
cannot be rebased is refused naming the tool's parameters: a reference by anchor (`"#name"`) and a local
reference under a nested `$id` (which the spec resolves from that `$id`'s schema). `checked` refuses them
in the schemas the llm compiles whole, too.
"""
from __future__ import annotations

from typing import Any

from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.tool_grammar import NO_PARAMETERS

# Keywords whose value maps names to schemas, and those whose value is an instance, not a schema.
NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                           "dependencies"})
INSTANCES = frozenset({"enum", "const", "default", "examples"})


def required(tools: list[dict], parallel: bool) -> dict:
    """The schema of `required`'s answer for these (checked) tools."""
    items, defs = [], {}
    for i, tool in enumerate(tools):
        key = f"__tool_{i}"
        parameters = tool["function"].get("parameters") or NO_PARAMETERS
        defs[key] = _rebased(parameters, f"#/$defs/{key}", f"tools[{i}].function.parameters", "", None)
        items.append({"type": "object", "properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]},
                                                       "parameters": {"$ref": f"#/$defs/{key}"}},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1,
              "$defs": defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def checked(schema: dict, at: str) -> dict:
    """A schema the llm compiles as it is (response_format's, a named tool's, a strict tool's), refused as
    `required` refuses its references (below): the grammar compiler would take an anchor or a reference under a
    nested `$id` for any value, without a word."""
    _rebased(schema, "#", at, "", None)
    return schema


def _rebased(schema: Any, base: str, at: str, path: str, id_path: str | None) -> Any:
    """`schema` (at JSON pointer `path` in the parameters) with its local references under `base`;
    `id_path` is where the nearest nested `$id` above it is."""
    if isinstance(schema, list):
        return [_rebased(item, base, at, f"{path}/{j}", id_path) for j, item in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    if path and isinstance(schema.get("$id"), str):
        id_path = path
    rebased = {}
    for key, value in schema.items():
        where = f"{path}/{key}"
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = _reference(value, base, at, where, id_path)
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            rebased[key] = {name: _rebased(sub, base, at, f"{where}/{name}", id_path) for name, sub in value.items()}
        else:
            rebased[key] = value if key in INSTANCES else _rebased(value, base, at, where, id_path)
    return rebased


def _reference(ref: str, base: str, at: str, where: str, id_path: str | None) -> str:
    if id_path is not None:
        raise APIError(400, f"{at} has the $ref {ref[:64]!r} at {where[:120]} under the $id at {id_path[:120]}; "
                            "local references are resolved from the schema's root here, so give the schema "
                            "without nested $id", at)
    if ref != "#" and not ref.startswith("#/"):
        raise APIError(400, f"{at} has the $ref {ref[:64]!r} at {where[:120]}, a reference by anchor; local "
                            "references here are '#' and JSON pointers ('#/$defs/...')", at)
    return base + ref[1:]
