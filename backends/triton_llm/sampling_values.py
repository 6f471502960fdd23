"""A request's sampling values as vLLM's request parsing takes them through vllm_backend: numbers or
numeric strings for numeric keys, bools or "true"/"false" for flags, lists or JSON-list strings for
`stop` and `stop_token_ids`. The result is a dict for llm_engine.SamplingParams, which checks ranges.
Anything else is refused naming the key, the value and what it must be.
"""
from __future__ import annotations

import json
import math
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
    "prompt_logprobs": "prompt_logprobs",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "truncate_prompt_tokens": "truncate_prompt_tokens",
    "bad_words": "bad_words",
    "allowed_token_ids": "allowed_token_ids",
    "logit_bias": "logit_bias",
    "detokenize": "detokenize",
    "guided_json": "guided decoding (structured output)",
    "guided_regex": "guided decoding (structured output)",
    "guided_choice": "guided decoding (structured output)",
    "guided_grammar": "guided decoding (structured output)",
    "structured_outputs": "structured outputs",
}


class SamplingValueError(ValueError):
    """A sampling value of the wrong kind; the message names key, value and kind."""


def coerce(params: dict[str, Any], source: str) -> dict[str, Any]:
    """`params` (a request's `sampling_parameters` or `parameters`) typed for SamplingParams.from_dict;
    `source` names where they came from in the errors."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "n":
            if _integer(source, key, value) != 1:
                raise SamplingValueError(f"{source}: n must be 1 (one sequence per request here), got {value!r}")
            continue
        if key == "lora_name":
            raise SamplingValueError("LoRA feature is not enabled.")  # vllm_backend's words
        if key in _UNSUPPORTED:
            if key == "best_of" and value in (1, "1", None):
                continue
            raise SamplingValueError(f"{source}: '{key}' is a vLLM sampling parameter this engine does not "
                                     f"implement ({_UNSUPPORTED[key]})")
        kind = _TYPES.get(key)
        if kind is None:
            out[key] = value  # SamplingParams.from_dict names the unknown key and the known ones
            continue
        if value is None:
            if type(None) in typing.get_args(kind):
                out[key] = None
            continue  # null leaves the default
        out[key] = _convert(source, key, value, kind)
    return out


def _convert(source: str, key: str, value: Any, kind: Any) -> Any:
    kinds = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
    base = kinds[0]
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


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
