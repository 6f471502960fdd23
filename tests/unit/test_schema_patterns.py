"""llm_engine/engine/schema_patterns.py: a schema's patterns rewritten where xgrammar would not enforce
them as written, and nothing else touched (instances, property names, escapes, character classes)."""
from __future__ import annotations

import re

import pytest

from llm_engine.engine.schema_patterns import enforceable, has_lookaround, optional_groups_bounded


@pytest.mark.parametrize("pattern, written", [
    (r"^a(?:xy+)?$", r"^a(?:xy+){0,1}$"),
    (r"^a(x(y*)?z+)?$", r"^a(x(y*){0,1}z+){0,1}$"),
    (r"^(c)??$", r"^(c){0,1}?$"),               # lazy: the same language
    (r"^\)?[)?]x?$", r"^\)?[)?]x?$"),           # an escaped paren, a class, a character's ?
    (r"^[\]()?](a)?$", r"^[\]()?](a){0,1}$"),   # an escaped ] stays in the class
    (r"^(?:ab)*(c){2}$", r"^(?:ab)*(c){2}$"),
])
def test_optional_groups_are_bounded_and_mean_the_same(pattern, written):
    assert optional_groups_bounded(pattern) == written
    for text in ("a", "axy", "ay", "az", "axz", "c", ")x", "abcc", "(a", "?", ""):
        assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(written, text)), text


def test_lookarounds_are_found_outside_escapes_and_classes():
    assert all(map(has_lookaround, [r"(?=a)", r"x(?!y)", r"(?<=a)b", r"(?<!a)b"]))
    assert not any(map(has_lookaround, [r"\(?=a", r"[(?=]", r"(?:a)", r"(?P<n>a)", r"(?<n>a)"]))


def test_the_pattern_wins_over_a_format_and_only_schema_positions_change():
    schema = {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "time", "pattern": "^(a)?$"},
            "format": {"type": "string", "format": "date"},      # a property named format, kept
            "pattern": {"const": {"pattern": "(a)?", "format": "x"}},   # an instance, kept
            "enum": {"type": "string", "pattern": "(b)?"},
        },
        "patternProperties": {"^x(y)?$": {"type": "string", "pattern": "(c)?"}},
        "$defs": {"d": {"anyOf": [{"type": "string", "pattern": "(d)?", "format": "email"}]}},
        "default": {"pattern": "(e)?"},
        "examples": [{"format": "date", "pattern": "(f)?"}],
    }
    assert enforceable(schema) == {
        "type": "object",
        "properties": {
            "at": {"type": "string", "pattern": "^(a){0,1}$"},
            "format": {"type": "string", "format": "date"},
            "pattern": {"const": {"pattern": "(a)?", "format": "x"}},
            "enum": {"type": "string", "pattern": "(b){0,1}"},
        },
        "patternProperties": {"^x(y){0,1}$": {"type": "string", "pattern": "(c){0,1}"}},
        "$defs": {"d": {"anyOf": [{"type": "string", "pattern": "(d){0,1}"}]}},
        "default": {"pattern": "(e)?"},
        "examples": [{"format": "date", "pattern": "(f)?"}],
    }
