"""Per-request generation settings, validated at construction so bad values fail at add_request."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint the output must follow (vLLM's StructuredOutputsParams): exactly one of a JSON
    schema (a dict or its JSON text), any JSON object, a regular expression, one of a list of
    strings, an EBNF grammar (xgrammar's dialect), or a structural tag (xgrammar's, a dict or its
    JSON text, as vLLM takes it: free text with constrained regions, such as tool calls after their
    trigger). The engine compiles it when the request arrives."""

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: dict | str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice or not all(
                    isinstance(c, str) and c for c in self.choice):
                raise ValueError(f"structured output choice must be a non-empty list of non-empty strings, "
                                 f"got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, dict):  # key order kept: a schema's property order is the output's
            object.__setattr__(self, "json", json.dumps(self.json))
        if isinstance(self.structural_tag, dict):
            object.__setattr__(self, "structural_tag", json.dumps(self.structural_tag))
        for name in ("json", "regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured output {name} must be a non-empty string or object, got {value!r}")
        if self.json is not None:
            try:
                schema = json.loads(self.json)
            except ValueError as exc:
                raise ValueError(f"structured output json is not valid JSON: {exc}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"structured output json must be a JSON schema (an object), got {self.json[:80]!r}")
        if self.structural_tag is not None:
            try:
                tag = json.loads(self.structural_tag)
            except ValueError as exc:
                raise ValueError(f"structured output structural_tag is not valid JSON: {exc}") from None
            if not isinstance(tag, dict):
                raise ValueError("structured output structural_tag must be an object {\"type\": \"structural_tag\", "
                                 f"\"format\": {{...}}}}, got {self.structural_tag[:80]!r}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured output json_object must be a bool, got {self.json_object!r}")
        given = [name for name in ("json", "regex", "choice", "grammar", "structural_tag")
                 if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError(f"structured output takes exactly one of json, json_object, regex, choice, grammar, "
                             f"structural_tag; got {given or 'none'}")

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the compiled constraint (the compile cache's key)."""
        if self.json_object:
            return "json_object", ""
        for name in ("json", "regex", "grammar", "structural_tag"):
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return "choice", json.dumps(self.choice)

    @classmethod
    def from_value(cls, value: Any) -> StructuredOutputs:
        if isinstance(value, StructuredOutputs):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"structured_outputs must be an object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown structured output key(s) {unknown}; known: {sorted(known)}")
        return cls(**value)


# Integers beyond int64 are refused: the sampler turns them into int64 tensors and seeds.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_LOGPROBS = 20  # most likely tokens reported per generated token (vLLM's default max_logprobs)
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value, either sign


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop (vLLM names and semantics).

    temperature 0 is greedy (exact argmax). top_k <= 0 and top_p == 1 and min_p == 0 disable the
    filters. repetition_penalty applies to prompt and output tokens, presence/frequency penalties to
    output tokens only. max_tokens None means "up to max_model_len". A `seed` makes the request's
    samples reproducible whatever else is in the batch. `logprobs` N reports each generated token's
    logprob and rank and the N most likely tokens' logprobs (0: the token's own only; True is 0).
    `prompt_logprobs` N does the same for each prompt token after the first, from the model's raw logits
    (no sampling setting applies), as vLLM does.
    `logit_bias` adds its value (OpenAI's -100 to 100) to its token id's logit before the penalties;
    JSON's string keys ("50256") are read as ids. `allowed_token_ids` restricts every pick to those ids.
    `truncate_prompt_tokens` k keeps the prompt's last k tokens (-1: max_model_len of them), as vLLM does.
    `include_stop_str_in_output` keeps the stop string that ended the output at its end (and, as vLLM's v1
    detokenizer, the text of a stop token, which a special token such as the eos mostly lacks).
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            # A dict or a string of digits would be iterable too, and silently mean something else.
            if not isinstance(getattr(self, name), (list, tuple)):
                raise ValueError(f"{name} must be a list, got {getattr(self, name)!r}")
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.logprobs, bool):
            self.logprobs = 0 if self.logprobs else None
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputs.from_value(self.structured_outputs)
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        self._validate()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        """Build from a request's JSON-like dict; unknown keys are an error, not silently ignored."""
        if not isinstance(d, dict):
            raise ValueError(f"sampling parameters must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:   # names come from clients: a few, cut short, keep the message small
            shown = [name if len(name) <= 64 else f"{name[:61]}..." for name in unknown[:8]]
            more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
            raise ValueError(f"unknown sampling parameter(s) {shown}{more}; known: {sorted(known)}")
        return cls(**d)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        """The sampler reads the tokens generated so far."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    def _validate(self) -> None:
        def number(name: str) -> float:
            value = getattr(self, name)
            if not _is_number(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
            # NaN passes every range check below; infinities (and ints beyond float range) break sampling.
            if not _is_finite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            return value

        def integer(name: str) -> int:
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if not INT64_MIN <= value <= INT64_MAX:
                raise ValueError(f"{name} must fit in 64 bits ({INT64_MIN} to {INT64_MAX}), got {value}")
            return value

        if number("temperature") < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        integer("top_k")
        if not 0 < number("top_p") <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= number("min_p") <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if number("repetition_penalty") <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= number(name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.seed is not None:
            integer("seed")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        if self.truncate_prompt_tokens is not None:
            keep = integer("truncate_prompt_tokens")
            if keep < 1 and keep != -1:
                raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1 (max_model_len), got {keep}")
        if self.allowed_token_ids is not None:
            allowed = self.allowed_token_ids
            if not isinstance(allowed, (list, tuple)) or not allowed or not all(_is_int(t) and t >= 0 for t in allowed):
                raise ValueError(f"allowed_token_ids must be a non-empty list of non-negative integers, "
                                 f"got {str(allowed)[:80]}")
            if self.structured_outputs is not None:  # the grammar's tokens and these may not meet
                raise ValueError("allowed_token_ids cannot be combined with structured output")
        if self.max_tokens is not None and integer("max_tokens") < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if integer("min_tokens") < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= integer("logprobs") <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= integer("prompt_logprobs") <= MAX_LOGPROBS:
            raise ValueError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


def _logit_bias(value: Any) -> dict[int, float]:
    """{token id: bias}, the ids as ints; the vocabulary bound is the engine's to check."""
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be an object of token id -> bias, got {value!r}")
    out = {}
    for key, bias in value.items():
        if isinstance(key, str) and key.strip().isdigit():
            token = int(key)
        elif _is_int(key) and key >= 0:
            token = key
        else:
            raise ValueError(f"logit_bias keys must be token ids (non-negative integers or their decimal "
                             f"strings), got {key!r}")
        if not _is_number(bias) or not _is_finite(bias) or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias[{key!r}] must be a number in [-{MAX_LOGIT_BIAS:g}, "
                             f"{MAX_LOGIT_BIAS:g}], got {bias!r}")
        if token in out:
            raise ValueError(f"logit_bias names token id {token} twice")
        out[token] = float(bias)
    return out
