"""JSON from clients, parsed strictly. Python's json.loads accepts NaN and Infinity, keeps the last
of repeated keys, converts integers of any length (thousands of digits cost time), nests until the
stack runs out and makes a lone surrogate of a `\\ud800` escape (no text: the tokenizer fails on it);
each of these is refused here with a message to prefix with the input's name."""
from __future__ import annotations

import json
import re
from typing import Any

MAX_INT_DIGITS = 32
MAX_DEPTH = 16          # deeper values would exhaust the stack when an error message prints them
_SURROGATE = re.compile("[\ud800-\udfff]")


class Refused(ValueError):
    """Why the text is refused, worded to follow "input 'NAME' "."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A proxy that checked the request may have read the first of two keys; json.loads keeps the last.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise Refused(f"has the key {key[:40]!r} more than once")
        result[key] = value
    return result


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise Refused(f"has an integer of {len(digits.lstrip('-'))} digits; the limit is {MAX_INT_DIGITS}")
    return int(digits)


def _no_constant(token: str):
    raise Refused(f"has {token}, which is not a JSON number")


def _check_depth_and_text(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(f"nests deeper than {MAX_DEPTH} levels")
        if isinstance(item, str) and _SURROGATE.search(item):
            raise Refused("has a lone surrogate escape (\\ud800-\\udfff), which is not text")
        children = [*item, *item.values()] if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)


def loads(text: str) -> Any:
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise Refused(f"is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:  # deeper than the parser can follow, so deeper than the limit too
        raise Refused(f"nests deeper than {MAX_DEPTH} levels") from None
    _check_depth_and_text(value)
    return value
