"""The JSON schemas the llm compiles (response_format's, a tool's parameters, vLLM's guided_json), checked
for what its grammar compiler, xgrammar, would not enforce; and `tool_choice: "required"`'s schema: a JSON
array (at most one item without parallel calls) of {"name": one tool's name, "parameters": that tool's
parameters}, anyOf over the tools, as vLLM builds it.

Each tool's parameters sit whole at the root's `$defs["__tool_<i>"]` and the item refers to them, so
their local references keep their meaning nested in the array: `"#"` becomes `"#/$defs/__tool_<i>"` and
`"#/<pointer>"` becomes `"#/$defs/__tool_<i>/<pointer>"` (`$defs`, draft-07's `definitions`, any pointer;
a definition referring to another is rewritten too), and each tool keeps its own names. What cannot be
rebased is refused naming the tool's parameters: a reference by anchor (`"#name"`) and a local reference
under a nested `$id` (which the spec resolves from that `$id`'s schema). `checked` refuses them in the
schemas the llm compiles whole, too.

xgrammar (0.2.8) writes what it does not enforce as any value, without a word, and the output would break
the schema; so `_enforced` refuses, with a 400 naming the keyword's field
(`response_format.json_schema.schema.properties.tags.uniqueItems`), in any schema object:
- a keyword xgrammar ignores (IGNORED: uniqueItems, contains, not, if/then/else, dependentRequired, ...)
  and a `$ref` that does not start with `#` (another document's, or one by `$id`);
- an assertion beside the keyword xgrammar reads such a schema by alone (ALONE: `$ref`, `const`, `enum`,
  `anyOf`, `oneOf`, `allOf`; a `type` that all of const's or enum's values have is redundant), and `allOf`
  with other than one subschema (xgrammar merges none);
- a keyword of one type in a schema without a `type` (none implied by properties or items, or by being
  propertyNames'), `type: []`, `required` naming a property `properties` lacks, a length beside a format
  xgrammar writes (FORMATS) or beside `pattern` (but a minLength every string written has), `multipleOf`
  beyond what xgrammar writes (an integer's, bounded), and a `pattern` with a lookahead or lookbehind
  (xgrammar drops them).
A `pattern` beside a format passes: the llm keeps the pattern, the assertion, over the format, an
annotation in JSON Schema (zod v4 writes both; llm_engine/engine/schema_patterns.py).
Annotations pass (title, description, default, examples, `$comment`, and a `format` xgrammar does not
know: JSON Schema's default takes format as an annotation). `oneOf` is written as anyOf where xgrammar
cannot prove its branches exclusive (docs/openai.md). tests/unit/test_openai_schema_keywords.py checks
each rule against the installed xgrammar.
"""
from __future__ import annotations

from typing import Any, Callable

from llm_engine.engine.schema_patterns import INSTANCES, NAMED_SCHEMAS, has_lookaround
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.tool_grammar import NO_PARAMETERS

# What xgrammar 0.2.8's json_schema_converter does, keyword by keyword. It ignores these wherever they are:
IGNORED = ("uniqueItems", "contains", "minContains", "maxContains", "not", "if", "then", "else", "dependentRequired",
           "dependentSchemas", "dependencies", "$dynamicRef", "$recursiveRef")
# It reads a schema by the first of these it has and nothing else (what to do with the rest: BESIDE)...
ALONE = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
BESIDE = {"$ref": "move it into the schema it refers to", "const": "remove it", "enum": "remove it",
          "anyOf": "move it into each subschema", "oneOf": "move it into each subschema",
          "allOf": "move it into the subschema"}
# ...else by its type, or the type these imply, with that type's keywords.
IMPLIED = {"object": ("properties", "additionalProperties", "unevaluatedProperties"),
           "array": ("items", "prefixItems", "unevaluatedItems")}
TYPE_KEYWORDS = {
    **dict.fromkeys(("properties", "patternProperties", "additionalProperties", "unevaluatedProperties", "required",
                     "minProperties", "maxProperties", "propertyNames"), "object"),
    **dict.fromkeys(("items", "prefixItems", "unevaluatedItems", "minItems", "maxItems"), "array"),
    **dict.fromkeys(("minLength", "maxLength", "pattern"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number")}
ASSERTIONS = frozenset({*ALONE, "type", *TYPE_KEYWORDS})
# The formats it writes as a regex, over any pattern and length beside them (others are any string); all
# but EMPTY_FORMATS are never "", so a minLength of 1 beside them holds (Pydantic's AnyUrl has it).
FORMATS = frozenset({"date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
                     "uri-reference", "uri-template", "uuid", "json-pointer", "relative-json-pointer"})
EMPTY_FORMATS = frozenset({"uri-reference", "uri-template", "json-pointer"})
JSON_TYPES = {bool: "boolean", str: "string", list: "array", dict: "object", type(None): "null"}
# multipleOf it writes: an integer's, a whole number up to this, with no bound or both, this many values apart.
MULTIPLE_OF_MAX = 1024
MULTIPLE_OF_RANGE = 10000


def required(tools: list[dict], parallel: bool) -> dict:
    """The schema of `required`'s answer for these (checked) tools."""
    items, defs = [], {}
    for i, tool in enumerate(tools):
        key = f"__tool_{i}"
        parameters = tool["function"].get("parameters") or NO_PARAMETERS
        defs[key] = _rebased(parameters, f"#/$defs/{key}", f"tools[{i}].function.parameters", (), None)
        items.append({"type": "object", "properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]},
                                                       "parameters": {"$ref": f"#/$defs/{key}"}},
                      "required": ["name", "parameters"], "additionalProperties": False})
    schema = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}, "minItems": 1,
              "$defs": defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def checked(schema: dict, at: str) -> dict:
    """A schema the llm compiles as it is (response_format's, a named tool's, a strict tool's, guided_json),
    refused where the grammar compiler would not enforce it (above) and where it has a reference `required`
    refuses: the compiler would take an anchor or a reference under a nested `$id` for any value."""
    _rebased(schema, "#", at, (), None)
    return schema


def _rebased(schema: Any, base: str, at: str, parts: tuple, id_parts: tuple | None,
             implied: str | None = None) -> Any:
    """`schema` (at path `parts` in the request field `at`) checked, with its local references under `base`;
    `id_parts` is where the nearest nested `$id` above it is; `implied` the type it has without `type`."""
    if isinstance(schema, list):
        return [_rebased(item, base, at, (*parts, j), id_parts) for j, item in enumerate(schema)]
    if not isinstance(schema, dict):
        return schema
    _enforced(schema, at, parts, implied)
    if parts and isinstance(schema.get("$id"), str):
        id_parts = parts
    rebased = {}
    for key, value in schema.items():
        where = (*parts, key)
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = _reference(value, base, at, where, id_parts)
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            rebased[key] = {name: _rebased(sub, base, at, (*where, name), id_parts) for name, sub in value.items()}
        elif key in INSTANCES:
            rebased[key] = value
        else:   # a property name is a string: the compiler reads propertyNames so
            rebased[key] = _rebased(value, base, at, where, id_parts, "string" if key == "propertyNames" else None)
    return rebased


def _reference(ref: str, base: str, at: str, where: tuple, id_parts: tuple | None) -> str:
    if id_parts is not None:
        raise APIError(400, f"{at} has the $ref {ref[:64]!r} at {_pointer(where)[:120]} under the $id at "
                            f"{_pointer(id_parts)[:120]}; local references are resolved from the schema's root here, "
                            "so give the schema without nested $id", at)
    if ref != "#" and not ref.startswith("#/"):
        raise APIError(400, f"{at} has the $ref {ref[:64]!r} at {_pointer(where)[:120]}, a reference by anchor; "
                            "local references here are '#' and JSON pointers ('#/$defs/...')", at)
    return base + ref[1:]


def _enforced(schema: dict, at: str, parts: tuple, implied: str | None) -> None:
    """Refuses what the grammar compiler would not enforce in this schema object (not its subschemas)."""
    for keyword in IGNORED:
        if keyword in schema and not (keyword == "uniqueItems" and schema[keyword] is False):
            _refuse(at, parts, keyword, "is not enforced by the grammar compiler; remove it")
    names = schema.get("patternProperties")
    if isinstance(names, dict) and any(has_lookaround(name) for name in names):
        _refuse(at, parts, "patternProperties", "has a pattern with a lookahead or lookbehind ((?=, (?!, (?<=, (?<!), "
                                                "which the grammar compiler does not enforce; remove it")
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        _refuse(at, parts, "$ref", f"{ref[:64]!r} is not enforced by the grammar compiler, which resolves only '#' "
                                   "and '#/...' in the schema itself; put the schema under $defs")
    alone = next((keyword for keyword in ALONE if keyword in schema), None)
    if alone is not None:
        _alone(schema, alone, at, parts)
    else:
        _typed(schema, at, parts, implied)


def _alone(schema: dict, alone: str, at: str, parts: tuple) -> None:
    if alone == "allOf" and isinstance(schema["allOf"], list) and len(schema["allOf"]) != 1:
        _refuse(at, parts, "allOf", f"with {len(schema['allOf'])} subschemas is not enforced by the grammar "
                                    "compiler (one subschema is); merge them into one")
    for keyword in schema:
        if keyword in ASSERTIONS and keyword != alone and not (keyword == "type" and _values_typed(schema, alone)):
            _refuse(at, parts, keyword, f"is not enforced beside {alone} by the grammar compiler, which reads only "
                                        f"{alone} there; {BESIDE[alone]}")


def _values_typed(schema: dict, alone: str) -> bool:
    """Whether `const`'s or `enum`'s values all have the schema's type, which is then redundant (an enum that
    is no list the compiler refuses)."""
    if alone not in ("const", "enum"):
        return False
    values, kinds = [schema["const"]] if alone == "const" else schema["enum"], _types(schema)
    return not isinstance(values, list) or bool(kinds) and all(_kinds_of(value) & kinds for value in values)


def _kinds_of(value: Any) -> set[str]:
    """The JSON types a value has (a whole number is an integer and a number)."""
    if _is_number(value):
        return {"integer", "number"} if _is_whole(value) else {"number"}
    return {JSON_TYPES[type(value)]} if type(value) in JSON_TYPES else set()


def _types(schema: dict, implied: str | None = None) -> set[str] | None:
    """The types the compiler writes for a schema read by its type: `type`'s, else `implied` or the one its
    keywords imply; None: any value."""
    if "type" not in schema and implied:
        return {implied}
    if "type" not in schema:
        return next(({kind} for kind, keys in IMPLIED.items() if any(key in schema for key in keys)), None)
    kind = schema["type"]
    if isinstance(kind, list):
        return {item for item in kind if isinstance(item, str)}
    return {kind} if isinstance(kind, str) else set()   # another value: the compiler refuses it


def _typed(schema: dict, at: str, parts: tuple, implied: str | None) -> None:
    if schema.get("type") == []:
        _refuse(at, parts, "type", "[] admits no value, and the grammar compiler takes it for any value; give a type")
    kinds = _types(schema, implied)
    if kinds is None:
        for keyword in schema:
            if keyword in TYPE_KEYWORDS:
                _refuse(at, parts, keyword, "is not enforced by the grammar compiler without a type; add "
                                            f"\"type\": \"{TYPE_KEYWORDS[keyword]}\"")
        return
    if "object" in kinds:
        _required(schema, at, parts)
    if "string" in kinds:
        _string(schema, at, parts)
    if "multipleOf" in schema and kinds & {"integer", "number"}:
        _multiple_of(schema, "number" in kinds, at, parts)


def _required(schema: dict, at: str, parts: tuple) -> None:
    names = schema.get("required") if isinstance(schema.get("required"), list) else []
    listed = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    missing = [name for name in names if isinstance(name, str) and name not in listed]
    if missing:
        _refuse(at, parts, "required", f"names {missing[0][:64]!r}, which properties does not list: the grammar "
                                       "compiler enforces required for listed properties only; add it there")


def _string(schema: dict, at: str, parts: tuple) -> None:
    """A length beside what the string is written by: its pattern, which the llm keeps over a format
    beside it (llm_engine/engine/schema_patterns.py), else a format xgrammar writes."""
    fmt = schema.get("format") if isinstance(schema.get("format"), str) else None
    if isinstance(schema.get("pattern"), str) and has_lookaround(schema["pattern"]):
        _refuse(at, parts, "pattern", "has a lookahead or lookbehind ((?=, (?!, (?<=, (?<!), which the grammar "
                                      "compiler does not enforce; remove it")
    if "pattern" in schema:
        over, fmt = "pattern", None
    elif fmt in FORMATS:
        over = f"format {fmt!r}"
    else:
        return
    for keyword in ("minLength", "maxLength"):
        if keyword in schema and not _implied_length(schema, keyword, fmt):
            _refuse(at, parts, keyword, f"is not enforced beside {over} by the grammar compiler; give one of them")


def _implied_length(schema: dict, keyword: str, fmt: str | None) -> bool:
    """Whether a minLength asks nothing every string written has: 0, or 1 beside a format never empty."""
    length = schema[keyword]
    return keyword == "minLength" and _is_number(length) and (
        length <= 0 or length <= 1 and fmt in FORMATS and fmt not in EMPTY_FORMATS)


def _multiple_of(schema: dict, number: bool, at: str, parts: tuple) -> None:
    step = schema["multipleOf"]
    if not _is_number(step) or step <= 0:
        return   # the compiler refuses it
    if number:
        _refuse(at, parts, "multipleOf", "is not enforced by the grammar compiler for type number, only for "
                                         "integers; remove it")
    if not _is_whole(step) or step > MULTIPLE_OF_MAX:
        _refuse(at, parts, "multipleOf", f"must be a whole number up to {MULTIPLE_OF_MAX} for the grammar compiler "
                                         "to enforce it")
    low = _bound(schema, "minimum", "exclusiveMinimum", 1, max)
    high = _bound(schema, "maximum", "exclusiveMaximum", -1, min)
    if (low is None) != (high is None) or (low is not None and high - low + 1 > MULTIPLE_OF_RANGE):
        _refuse(at, parts, "multipleOf", "is enforced by the grammar compiler only with both or neither of a "
                                         f"minimum and a maximum, at most {MULTIPLE_OF_RANGE} values apart")


def _bound(schema: dict, inclusive: str, exclusive: str, step: int, tighter: Callable) -> float | None:
    """An integer's bound on one side, exclusive ones moved by `step`; None when the side is open."""
    bounds = [schema[inclusive]] if _is_number(schema.get(inclusive)) else []
    bounds += [schema[exclusive] + step] if _is_number(schema.get(exclusive)) else []
    return tighter(bounds) if bounds else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(number: float) -> bool:
    return isinstance(number, int) or number.is_integer()


def _refuse(at: str, parts: tuple, keyword: str, why: str) -> None:
    field = _field(at, (*parts, keyword))[:200]
    raise APIError(400, f"{field}: {keyword} {why}", field)


def _field(at: str, parts: tuple) -> str:
    return at + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)


def _pointer(parts: tuple) -> str:
    return "".join(f"/{part}" for part in parts)
