"""A JSON schema's patterns as xgrammar (0.2.8, 0.2.9) enforces them, before it compiles the schema.

- xgrammar's builtin for a schema's `pattern` drops what an optional group holds before a repetition
  at the group's end: `^a(?:xy+)?$` takes "ay". The same group written `{0,1}` compiles right, so each
  group's `?` is written `{0,1}` (zod's `z.iso.time()` has `(?::[0-5]\\d(?:\\.\\d+)?)?`).
- A `pattern` beside a `format` xgrammar writes is ignored in favour of the format. JSON Schema takes
  the format as an annotation and the pattern as the assertion, and clients validate against the pattern
  (zod v4 writes both, its own pattern stricter than the format), so the pattern wins: the format goes.

Only schema positions are rewritten: instances (const, enum, default, examples) keep their values, and
names under properties are names, whatever they are called.
"""
from __future__ import annotations

# Keywords whose value maps names to schemas, and those whose value is data (an instance; OpenAPI's
# discriminator, which maps values to references), not a schema.
NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                           "dependencies"})
INSTANCES = frozenset({"enum", "const", "default", "examples", "discriminator"})


def enforceable(schema):
    """The schema (parsed JSON) with its patterns written as xgrammar enforces them."""
    if isinstance(schema, list):
        return [enforceable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in INSTANCES:
            out[key] = value
        elif key == "pattern" and isinstance(value, str):
            out[key] = optional_groups_bounded(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {optional_groups_bounded(name): enforceable(sub) for name, sub in value.items()}
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: enforceable(sub) for name, sub in value.items()}
        else:
            out[key] = enforceable(value)
    if isinstance(out.get("pattern"), str):
        out.pop("format", None)
    return out


def optional_groups_bounded(pattern: str) -> str:
    """`pattern` with each group's `?` quantifier written `{0,1}`."""
    out, skip = [], False
    for i, char, plain in _scanned(pattern):
        if skip:
            skip = False
        elif plain and char == ")" and pattern.startswith("?", i + 1):
            out.append("){0,1}")
            skip = True
        else:
            out.append(char)
    return "".join(out)


def has_lookaround(pattern: str) -> bool:
    """Whether `pattern` asserts a lookahead or lookbehind, which xgrammar ignores (with a warning)."""
    return any(plain and char == "(" and pattern.startswith(("?=", "?!", "?<=", "?<!"), i + 1)
               for i, char, plain in _scanned(pattern))


def _scanned(pattern: str):
    """(index, character, plain) for each character: plain unless escaped or in a character class
    (ECMA-262's syntax: a class ends at its first unescaped `]`)."""
    escaped = in_class = False
    for i, char in enumerate(pattern):
        if escaped:
            escaped = False
            yield i, char, False
        elif char == "\\":
            escaped = True
            yield i, char, False
        elif in_class:
            in_class = char != "]"
            yield i, char, False
        else:
            in_class = char == "["
            yield i, char, not in_class
