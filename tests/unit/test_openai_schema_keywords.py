"""The schemas the frontend hands the llm (tool_schema.py, structured.py): what the grammar compiler would not
enforce is refused with a 400 naming the keyword's field, whichever way the schema comes (response_format,
a tool's parameters under required, named or strict auto, vLLM's guided_json and structured_outputs.json, as
an object or as JSON text); what it enforces passes. Each rule is checked against the installed xgrammar,
compiled as the llm compiles a json constraint: a refused schema's invalid instance is one xgrammar would
let through, an accepted schema's is one it stops. And vLLM's keys given as objects reach the llm as JSON
text, so a deep schema stays within the llm's 16 levels of sampling_parameters."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
import strict_json  # noqa: E402
from sampling_values import coerce  # noqa: E402

from llm_engine.engine.structured_output import _json_schema_grammar  # noqa: E402
from llm_engine.sampling_params import SamplingParams  # noqa: E402
from ragstack.openai_frontend import structured, tool_schema  # noqa: E402
from ragstack.openai_frontend.errors import APIError  # noqa: E402
from ragstack.openai_frontend.tools import ToolPlan  # noqa: E402

I = {"type": "integer"}  # noqa: E741
S = {"type": "string"}
# (schema, an instance invalid under it that xgrammar would write, the refused keyword's path in the schema)
REFUSED = [
    ({"type": "array", "items": S, "uniqueItems": True}, ["a", "a"], "uniqueItems"),
    ({"type": "array", "items": I, "contains": {"const": 1}}, [2], "contains"),
    ({"type": "integer", "not": {"const": 0}}, 0, "not"),
    ({"allOf": [I, {"minimum": 3}]}, 1, "allOf"),
    ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}, 7, "if"),
    ({"type": "integer", "if": {"minimum": 3}, "else": {"const": 0}}, 1, "if"),
    ({"type": "object", "properties": {"a": I, "b": I}, "dependentRequired": {"a": ["b"]}}, {"a": 1},
     "dependentRequired"),
    ({"type": "object", "properties": {"a": I, "b": I}, "dependentSchemas": {"a": {"required": ["b"]}}}, {"a": 1},
     "dependentSchemas"),
    ({"$dynamicRef": "#m", "$defs": {"m": {"$dynamicAnchor": "m", "type": "integer"}}}, "x", "$dynamicRef"),
    ({"type": []}, 1, "type"),
    ({"type": "object", "properties": {"a": I}, "required": ["b"], "additionalProperties": True}, {"a": 1},
     "required"),
    ({"type": "object", "required": ["b"], "additionalProperties": True}, {}, "required"),
    ({"minimum": 3}, 2, "minimum"),
    ({"minLength": 3}, "a", "minLength"),
    ({"minItems": 2}, [1], "minItems"),
    ({"required": ["a"]}, {}, "required"),
    ({"$ref": "#/$defs/A", "maxLength": 1, "$defs": {"A": S}}, "aa", "maxLength"),
    ({"type": "object", "properties": {"a": I, "b": I}, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, {},
     "type"),
    ({"type": "string", "enum": ["a", 1]}, 1, "type"),
    ({"type": "integer", "allOf": [{"minimum": 3}]}, "x", "type"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, "aaaa", "maxLength"),
    ({"type": ["string", "null"], "pattern": "^a+$", "minLength": 3}, "a", "minLength"),
    ({"type": "string", "pattern": "^P(?=\\d)\\d*$"}, "P", "pattern"),
    ({"type": "string", "format": "duration", "pattern": "^P(?!T)[0-9DT]+$"}, "PT", "pattern"),
    ({"type": "object", "patternProperties": {"^(?!x)[a-z]+$": I}, "additionalProperties": False}, {"xa": 1},
     "patternProperties"),
    ({"type": "string", "format": "date", "maxLength": 3}, "2020-01-01", "maxLength"),
    ({"type": "string", "format": "json-pointer", "minLength": 1}, "", "minLength"),
    ({"type": "string", "pattern": "^a*$", "minLength": 1}, "", "minLength"),
    ({"type": "object", "additionalProperties": True, "propertyNames": {"pattern": "^a+$", "maxLength": 1}},
     {"aaa": 1}, "propertyNames.maxLength"),
    ({"type": "number", "multipleOf": 0.5}, 0.3, "multipleOf"),
    ({"type": "integer", "multipleOf": 2000}, 4, "multipleOf"),
    ({"type": "integer", "multipleOf": 1.5}, 4, "multipleOf"),
    ({"type": "integer", "multipleOf": 3, "minimum": 0}, 4, "multipleOf"),
    ({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 10000}, 4, "multipleOf"),
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {
        "anyOf": [S, {"type": "integer", "not": {"const": 0}}]}}}}, {"tags": ["a", 0]},
     "properties.tags.items.anyOf[1].not"),
]
# (schema, an instance invalid under it, which xgrammar does not write)
ENFORCED = [
    ({"type": "integer", "minimum": 3}, 2),
    ({"type": "number", "exclusiveMaximum": 3}, 3),
    ({"type": "string", "maxLength": 2}, "abc"),
    ({"type": "string", "pattern": "^a+$"}, "b"),
    ({"type": "string", "format": "date"}, "x"),
    ({"type": "string", "format": "foo", "minLength": 2}, "a"),
    ({"type": "string", "format": "uri", "minLength": 1}, ""),
    ({"type": "string", "pattern": "^a+$", "minLength": 0}, "b"),
    ({"type": "string", "format": "date", "pattern": "^1"}, "2020-01-01"),   # the pattern, not the format
    ({"type": "string", "pattern": "^a(?:xy+)?$"}, "ay"),   # an optional group ending in a repetition
    ({"type": "string", "pattern": "^a(x(y*)?z+)?$"}, "az"),
    ({"type": "object", "patternProperties": {"^a(?:xy+)?$": I}, "additionalProperties": False}, {"ay": 1}),
    ({"type": "array", "items": I, "minItems": 2, "maxItems": 3}, [1]),
    ({"type": "array", "prefixItems": [I], "items": False}, [1, 2]),
    ({"type": "array", "items": S, "uniqueItems": False}, [1]),
    ({"type": "object", "properties": {"a": I}, "required": ["a"]}, {}),
    ({"properties": {"a": I}, "required": ["a"]}, {}),
    ({"type": "object", "additionalProperties": I, "minProperties": 1}, {}),
    ({"type": "object", "additionalProperties": I, "maxProperties": 1}, {"a": 1, "b": 2}),
    ({"type": "object", "patternProperties": {"^x": I}}, {"x": "s"}),
    ({"type": "object", "additionalProperties": True, "propertyNames": {"maxLength": 1}}, {"ab": 1}),
    ({"type": "object", "properties": {"a": I}, "unevaluatedProperties": False}, {"b": 1}),
    ({"type": "array", "prefixItems": [I], "unevaluatedItems": S}, [1, 2]),
    ({"type": "integer", "multipleOf": 3}, 4),
    ({"type": "integer", "multipleOf": 3, "exclusiveMinimum": 0, "exclusiveMaximum": 10000}, 4),
    ({"type": ["integer", "null"], "minimum": 1}, 0),
    ({"anyOf": [I, {"type": "null"}], "default": None, "title": "n"}, "a"),
    ({"oneOf": [I, S]}, True),
    ({"allOf": [{"$ref": "#/$defs/A"}], "description": "d", "$defs": {"A": I}}, "a"),
    ({"$ref": "#/$defs/A", "description": "d", "$defs": {"A": I}}, "a"),
    ({"type": "string", "enum": ["a", "b"]}, "c"),
    ({"type": ["string", "null"], "enum": ["a", None]}, "b"),
    ({"type": "integer", "const": 1.0}, 2),
    ({"type": "string", "title": "t", "description": "d", "$comment": "c", "examples": ["x"], "default": "x",
      "deprecated": True, "readOnly": True, "format": "password", "contentEncoding": "base64", "x-vendor": 1}, 1),
    ({"type": "object", "properties": {"uniqueItems": I, "not": S, "if": I}, "required": ["uniqueItems", "not"],
      "additionalProperties": False}, {"uniqueItems": 1}),
    ({"enum": [{"uniqueItems": True}, {"not": 1}]}, {"if": 1}),
    ({"type": "object", "properties": {"kind": {"const": "not"}}, "required": ["kind"],
      "discriminator": {"propertyName": "kind", "mapping": {"not": "#", "if": "#"}}}, {}),
]


def _compiled(schema: dict):
    """The schema's grammar as the llm compiles a json constraint (compact JSON, its patterns enforced)."""
    xgrammar = pytest.importorskip("xgrammar")
    return _json_schema_grammar(xgrammar, json.dumps(schema))


def _written(schema: dict, instance) -> bool:
    """Whether xgrammar's grammar of `schema` takes `instance` (written compactly, as the llm writes JSON)."""
    grammar = _compiled(schema)
    from xgrammar.testing import _is_grammar_accept_string   # noqa: PLC0415 - _compiled skips without xgrammar

    return _is_grammar_accept_string(grammar, json.dumps(instance))


def _invalid(schema: dict, instance) -> bool:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return not validator.is_valid(instance)


@pytest.mark.parametrize("schema, instance, path", REFUSED, ids=[path for _, _, path in REFUSED])
def test_refused_keywords_name_their_field(schema, instance, path):
    with pytest.raises(APIError) as refused:
        tool_schema.checked(schema, "response_format.json_schema.schema")
    field = f"response_format.json_schema.schema.{path}"
    assert (refused.value.status, refused.value.param) == (400, field)
    assert refused.value.message.startswith(f"{field}: ") and "grammar compiler" in refused.value.message


@pytest.mark.parametrize("schema, instance, path", REFUSED, ids=[path for _, _, path in REFUSED])
def test_each_refusal_is_needed_with_the_installed_xgrammar(schema, instance, path):
    """xgrammar writes an instance the schema forbids: the refusal keeps the output valid."""
    assert _invalid(schema, instance)
    assert _written(schema, instance)


def test_remote_and_dynamic_references_would_be_any_value():
    for schema in ({"$ref": "http://example.com/s.json"}, {"$ref": "s.json#/a"}, {"$dynamicRef": "#m"},
                   {"$recursiveRef": "#"}):
        assert _written(schema, {"any": ["value"]})
        with pytest.raises(APIError) as refused:
            tool_schema.checked({"type": "object", "properties": {"p": schema}}, "guided_json")
        assert refused.value.param == f"guided_json.properties.p.{next(iter(schema))}"


@pytest.mark.parametrize("schema, instance", ENFORCED)
def test_enforced_keywords_pass(schema, instance):
    assert tool_schema.checked(schema, "response_format.json_schema.schema") is schema
    assert _invalid(schema, instance)
    assert not _written(schema, instance)


# zod v4's string types as the openai Node SDK's zodResponseFormat sends them (z.toJSONSchema, zod 4.6.7):
# a format and zod's own pattern beside it, or a pattern alone (z.iso.time()).
ZOD_PATTERNS = {
    "email": ("email",
              "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9"
              "\\-]*\\.)+[A-Za-z]{2,}$"),
    "uuid": ("uuid",
             "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-"
             "F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"),
    "date-time": ("date-time",
                  "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)"
                  "-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]"
                  "|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d"
                  "(?:\\.\\d+)?(?:Z))$"),
    "date": ("date",
             "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)"
             "-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]"
             "|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$"),
    "time": (None,
             "^(?:[01]\\d|2[0-3]):[0-5]\\d(?::[0-5]\\d(?:\\.\\d+)?)?$"),
    "ipv4": ("ipv4",
             "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9"
             "]|1[0-9][0-9]|[1-9][0-9]|[0-9])$"),
}
# (zod type, a string its pattern refuses that xgrammar wrote or would write without the rewrites)
ZOD_REFUSES = [("time", "22:01076837222474"), ("date-time", "2024-01-01T10:00:00+01:00"),
               ("date-time", "2023-02-29T10:00:00Z"), ("date", "2023-02-29"), ("email", "a@b"),
               ("uuid", "00000000-0000-0000-0000-000000000001"), ("ipv4", "01.2.3.4")]


@pytest.mark.parametrize("zod_type, string", ZOD_REFUSES)
def test_zod_v4_string_types_pass_and_their_pattern_holds(zod_type, string):
    """zod v4 writes a format and its own pattern beside it; the llm keeps the pattern, which the answer is
    validated against (the format would let through a `+01:00` offset zod refuses)."""
    fmt, pattern = ZOD_PATTERNS[zod_type]
    schema = {"type": "string", "pattern": pattern, **({"format": fmt} if fmt else {})}
    assert tool_schema.checked(schema, "s") is schema
    assert _invalid(schema, string) and not _written(schema, string)


def test_zod_v4_duration_is_refused_for_its_lookahead():
    """z.iso.duration()'s pattern asserts with lookaheads, which xgrammar drops: "P" would be written."""
    schema = {"type": "string", "format": "duration",
              "pattern": "^P(?:(\\d+W)|(?!.*W)(?=\\d|T\\d)(\\d+Y)?(\\d+M)?(\\d+D)?(T(?=\\d)(\\d+H)?(\\d+M)?"
                         "(\\d+([.,]\\d+)?S)?)?)$"}
    with pytest.raises(APIError, match=r"s.properties.d.pattern: pattern has a lookahead or lookbehind"):
        tool_schema.checked({"type": "object", "properties": {"d": schema}}, "s")
    assert _invalid(schema, "P") and _written(schema, "P")


def test_formats_xgrammar_writes_and_those_it_does_not():
    """FORMATS are the formats the installed xgrammar writes; any other is any string, an annotation."""
    for fmt in sorted(tool_schema.FORMATS):
        assert not _written({"type": "string", "format": fmt}, "!! {"), fmt
        assert _written({"type": "string", "format": fmt}, "") == (fmt in tool_schema.EMPTY_FORMATS), fmt
    for fmt in ("password", "binary", "regex", "iri", "foo"):
        assert _written({"type": "string", "format": fmt}, "!! {"), fmt
        beside = {"type": "string", "format": fmt, "pattern": "^a+$"}   # the pattern still holds
        assert tool_schema.checked(beside, "s") and not _written(beside, "b")


def test_uniqueitems_false_and_minmax_contains_alone_differ():
    """uniqueItems false asks nothing; minContains and maxContains mean nothing without contains, which is
    refused anyway, so they are refused as contains is."""
    tool_schema.checked({"type": "array", "uniqueItems": False}, "s")
    for keyword in ("minContains", "maxContains"):
        with pytest.raises(APIError, match=f"s.{keyword}: {keyword} is not enforced"):
            tool_schema.checked({"type": "array", keyword: 1}, "s")


def test_every_way_in_names_the_field():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": S, "uniqueItems": True}}}
    tools = [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
    text = json.dumps(schema)
    ways = [
        ("response_format.json_schema.schema", lambda: structured.response_format(
            {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})),
        ("guided_json", lambda: structured.constrained({}, {"guided_json": schema}, None, {}, None)),
        ("guided_json", lambda: structured.constrained({}, {"guided_json": text}, None, {}, None)),
        ("structured_outputs.json", lambda: structured.constrained(
            {}, {"structured_outputs": {"json": schema}}, None, {}, None)),
        ("structured_outputs.json", lambda: structured.constrained(
            {}, {"structured_outputs": json.dumps({"json": text})}, None, {}, None)),
        ("tools[1].function.parameters", lambda: ToolPlan(tools, "required").constraint()),
        ("tools[1].function.parameters", lambda: ToolPlan(tools, "function", "f").constraint()),
        ("tools[1].function.parameters", lambda: ToolPlan(tools, "auto", parser="hermes").strict_constraint()),
    ]
    for i, (at, call) in enumerate(ways):
        with pytest.raises(APIError) as refused:
            call()
        assert refused.value.param == f"{at}.properties.tags.uniqueItems", i


KEYWORDS = st.sampled_from([*tool_schema.ASSERTIONS, *tool_schema.IGNORED, "format", "title", "$id", "x"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                    st.sampled_from(["", "#", "#/$defs/a", "http://x", "string", "integer", "number", "object",
                                     "date", "^a$"]))
SCHEMAS = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(KEYWORDS, inner, max_size=4)), max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYWORDS, SCHEMAS, max_size=5))
def test_any_schema_is_passed_or_refused_naming_a_field(schema):
    try:
        tool_schema.checked(schema, "guided_json")
    except APIError as refused:
        assert refused.status == 400 and refused.param.startswith("guided_json")


def test_texts_and_other_keys_go_as_they_came():
    """A text that does not parse is the llm's to refuse; a structured_outputs text is checked and sent as is."""
    for extra in ({"guided_json": "{not json"}, {"guided_json": "[1]"}, {"structured_outputs": "{not json"},
                  {"structured_outputs": json.dumps({"json": {"type": "object", "properties": {"a": I}}})},
                  {"guided_regex": "a+"}, {"guided_choice": ["a", "b"]}, {"structured_outputs": {"choice": ["a"]}}):
        sampling, param = structured.constrained({"seed": 1}, extra, None, {}, None)
        assert (sampling, param) == ({"seed": 1, **extra}, next(iter(extra)))


def test_a_text_too_deep_to_parse_is_400_naming_its_key():
    deep = '{"items": ' * 5000 + "{}" + "}" * 5000
    for key, value in (("guided_json", deep), ("structured_outputs", json.dumps({"json": deep}))):
        with pytest.raises(APIError) as refused:
            structured.constrained({}, {key: value}, None, {}, None)
        assert (refused.value.status, refused.value.param) == (400, key)


def _deep_object(levels: int) -> dict:
    schema = {"type": "boolean"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


TAG = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<t>"], "tags": [
    {"type": "tag", "begin": "<t>", "end": "</t>",
     "content": {"type": "json_schema", "json_schema": _deep_object(8)}}]}}


@pytest.mark.parametrize("extra, field, expected", [
    ({"guided_json": _deep_object(20)}, "json", _deep_object(20)),
    ({"structured_outputs": {"json": _deep_object(20)}}, "json", _deep_object(20)),
    ({"structural_tag": TAG}, "structural_tag", TAG),
    ({"structured_outputs": {"structural_tag": TAG}}, "structural_tag", TAG),
], ids=["guided_json", "structured_outputs.json", "structural_tag", "structured_outputs.structural_tag"])
def test_objects_reach_the_llm_as_json_text(extra, field, expected):
    """The llm reads sampling_parameters 16 levels deep at most: a schema object 20 levels deep (41 JSON
    levels) fits as text, and the llm's own parsing takes the text for the same constraint."""
    sampling, _ = structured.constrained({"temperature": 1.0}, extra, None, {}, None)
    read = strict_json.loads(json.dumps(sampling))   # the llm's parser, 16 levels at most
    outputs = SamplingParams.from_dict(coerce(read, "sampling_parameters")).structured_outputs
    assert json.loads(getattr(outputs, field)) == expected
