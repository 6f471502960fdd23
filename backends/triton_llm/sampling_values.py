"""A request's sampling values as vLLM's request parsing takes them through vllm_backend: numbers or
numeric strings for numeric keys, bools or "true"/"false" for flags, lists or JSON-list strings for
`stop`, `stop_token_ids` and `allowed_token_ids`, an object or its JSON text for `logit_bias`. The result is a dict for
llm_engine.SamplingParams, which checks ranges.
Anything else is refused naming the key, the value and what it must be.
"""
from __future__ import annotations

import json
import math
import types
import typing
from typing import Any

from llm_engine.sampling_params import SamplingParams

_TYPES = typing.get_type_hints(SamplingParams)
# vLLM sampling keys this engine does not implement: refused in words a vLLM user recognises.
_UNSUPPORTED = {
    "best_of": "best_of > 1 (one sequence per request here)",
    "use_beam_search": "beam search",
    "length_penalty": "beam search's length_penalty",
    "early_stopping": "beam search's early_stopping",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "bad_words": "bad_words",
    "detokenize": "detokenize",
    "guided_whitespace_pattern": "a whitespace pattern (structured output is compact JSON)",
}
# vLLM's default of each, which asks for what this engine does anyway: that value (or null) passes and is
# dropped, as clients that send every key at its default (vLLM's own request models) expect.
_NO_OP_DEFAULTS = {"best_of": 1, "use_beam_search": False, "length_penalty": 1.0, "early_stopping": False,
                   "spaces_between_special_tokens": True, "bad_words": [], "detokenize": True,
                   "guided_whitespace_pattern": None}
# vLLM's guided-decoding keys, each a field of its `structured_outputs` object (`structural_tag` is the
# request key vLLM had beside the guided_* ones, for the same field).
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
           "structural_tag": "structural_tag"}
# StructuredOutputsParams fields with nothing to choose here: one grammar engine, compact JSON.
_STRUCTURED_NO_OPS = {"disable_fallback", "disable_any_whitespace"}


class SamplingValueError(ValueError):
    """A sampling value of the wrong kind; the message names key, value and kind."""


def coerce(params: dict[str, Any], source: str) -> dict[str, Any]:
    """`params` (a request's `sampling_parameters` or `parameters`) typed for SamplingParams.from_dict;
    `source` names where they came from in the errors."""
    out: dict[str, Any] = {}
    structured: dict[str, Any] = {}
    for key, value in params.items():
        if key in _GUIDED or key == "structured_outputs" or key == "guided_decoding_backend":
            _structured(source, key, value, structured)
            continue
        if key == "n":
            if _integer(source, key, value) != 1:
                raise SamplingValueError(f"{source}: n must be 1 (one sequence per request here), got {value!r}")
            continue
        if key == "lora_name":
            raise SamplingValueError("LoRA feature is not enabled.")  # vllm_backend's words
        if key in _UNSUPPORTED:
            if _is_no_op_default(source, key, value):
                continue
            raise SamplingValueError(f"{source}: '{key}' is a vLLM sampling parameter this engine does not "
                                     f"implement ({_UNSUPPORTED[key]})")
        kind = _TYPES.get(key)
        if kind is None:
            out[key] = value  # SamplingParams.from_dict names the unknown key and the known ones
            continue
        if value is None:
            if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind):
                out[key] = None
            continue  # null leaves the default
        out[key] = _convert(source, key, value, kind)
    if structured:
        out["structured_outputs"] = structured  # SamplingParams checks it holds exactly one constraint
    return out


def _is_no_op_default(source: str, key: str, value: Any) -> bool:
    """Whether `value`, read as vLLM reads its kind ("false", "1.0", "[]" included), is the key's vLLM default."""
    default = _NO_OP_DEFAULTS[key]
    if value is None or default is None:
        return value is None
    read = {bool: _flag, int: _integer, float: _number}.get(type(default))
    try:
        value = read(source, key, value) if read else _list(source, key, value, str)
    except SamplingValueError:
        return False  # no value of the key's kind: refused as any other value it does not implement
    return value == default


def _structured(source: str, key: str, value: Any, into: dict[str, Any]) -> None:
    """vLLM's guided_* keys and its structured_outputs object (or its JSON text, as vllm_backend
    takes it) into one structured_outputs dict."""
    if value is None:
        return
    if key == "guided_decoding_backend":
        if value not in ("xgrammar", "auto"):
            raise SamplingValueError(f"{source}: 'guided_decoding_backend' = {_shown(value)}: this engine's "
                                     "structured output uses xgrammar only")
        return
    if key in _GUIDED:
        field = _GUIDED[key]
        into[field] = _list(source, key, value, str) if field == "choice" else value
        return
    value = _object(source, "structured_outputs", value)
    into.update((k, v) for k, v in value.items() if k not in _STRUCTURED_NO_OPS and v is not None)


def _convert(source: str, key: str, value: Any, kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: X
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    base = kind
    if key == "logprobs" and isinstance(value, bool):
        return value  # the engine's own flag: True is 0 (the token's own logprob)
    if base is float:
        return _number(source, key, value)
    if base is int:
        return _integer(source, key, value)
    if base is bool:
        return _flag(source, key, value)
    if typing.get_origin(base) is list:
        item = typing.get_args(base)[0]
        return _list(source, key, value, item)
    if typing.get_origin(base) is dict:
        return {k: _number(source, f"{key}[{k!r}]", v) for k, v in _object(source, key, value).items()}
    return value


def _number(source: str, key: str, value: Any) -> float | int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            return number
    raise SamplingValueError(f"{source}: '{key}' must be a number or a numeric string, got {_shown(value)}")


def _integer(source: str, key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise SamplingValueError(f"{source}: '{key}' must be an integer or an integer string, got {_shown(value)}")


def _flag(source: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SamplingValueError(f"{source}: '{key}' must be true or false (a bool or the string), got {_shown(value)}")


def _list(source: str, key: str, value: Any, item: type) -> list:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise SamplingValueError(f"{source}: '{key}' is not a valid JSON list: {_shown(text)}") from None
        elif item is str:
            return [value]  # a single stop string
    if not isinstance(value, list):
        raise SamplingValueError(f"{source}: '{key}' must be a list (or a JSON-list string), got {_shown(value)}")
    if item is int:
        return [_integer(source, f"{key}[{i}]", v) for i, v in enumerate(value)]
    return value


def _object(source: str, key: str, value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SamplingValueError(f"{source}: '{key}' is not a valid JSON object: {_shown(value)}") from None
    if not isinstance(value, dict):
        raise SamplingValueError(f"{source}: '{key}' must be an object (or its JSON text), got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
