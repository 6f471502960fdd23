"""Twenty JSON schemas for structured-output benchmarks: the features structured output meets in
practice (nested objects, arrays, enums, bounded numbers, optional keys, anyOf), none with a length
bound that a random model's output would reach at once, so guided requests run about as long as free ones.
"""
from __future__ import annotations

_FIELDS = [
    ("name", {"type": "string"}),
    ("count", {"type": "integer", "minimum": 0, "maximum": 100000}),
    ("score", {"type": "number"}),
    ("active", {"type": "boolean"}),
    ("tags", {"type": "array", "items": {"type": "string"}}),
    ("status", {"enum": ["open", "closed", "pending", "unknown"]}),
    ("owner", {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}},
               "required": ["id", "email"]}),
    ("notes", {"type": "array", "items": {"type": "object", "properties": {"text": {"type": "string"}},
                                          "required": ["text"]}}),
    ("ref", {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
    ("summary", {"type": "string"}),
]


def schemas(n: int = 20) -> list[dict]:
    """`n` different object schemas, each of three to six of the fields above, some optional."""
    out = []
    for i in range(n):
        width = 3 + i % 4
        picked = [_FIELDS[(i * 3 + k * 7) % len(_FIELDS)] for k in range(width)]
        properties = {f"{name}_{i}" if k == 0 else name: spec for k, (name, spec) in enumerate(picked)}
        required = [key for k, key in enumerate(properties) if k % 3 != 2]
        out.append({"type": "object", "properties": properties, "required": required,
                    "additionalProperties": False})
    return out
