"""Hypothesis strategies of bad generation requests (the llm, and the rag ensemble that passes
`sampling_parameters` and `max_tokens` on to it): hostile sampling JSON, bad prompts and chat
messages, out-of-range token counts. Each case carries its tensors for gRPC and, where JSON can
express it, the same request as an HTTP generate body."""
from __future__ import annotations

import dataclasses
import json
import math

from hypothesis import strategies as st

from bad_input import Case, tensor
from bad_input_strategies import FINITE, INT64, _not_utf8
from llm_engine.sampling_params import SamplingParams

# Keys the llm reads: SamplingParams' fields and vLLM's that map onto them (n and best_of of 1, structured
# output's own keys: test_llm_structured_output.py; vLLM's keys it passes at their no-op default, such as
# length_penalty 1: tests/unit/test_sampling_values.py).
KNOWN = sorted({f.name for f in dataclasses.fields(SamplingParams)} | {
    "n", "best_of", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "use_beam_search", "length_penalty", "early_stopping", "spaces_between_special_tokens", "bad_words",
    "detokenize", "guided_whitespace_pattern"})
NUMERIC = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"]
BOOLEAN = ["ignore_eos", "skip_special_tokens", "include_stop_str_in_output"]
JSON_LIMIT = 64 << 10
MAX_MODEL_LEN = 2048        # model_repository/llm/config.pbtxt
MAX_PROMPT_BYTES = 1 << 20  # the llm's max_prompt_bytes
CHAT = '[{"role": "user", "content": "hi"}]'

BIG = 10 ** 30  # integers stay under the backend's 32 digits, so the error is about the key, not the JSON
_INT = st.integers(-BIG, BIG)


def _reads_as_value(text: str) -> bool:
    """A string the llm reads as a number or a flag (sampling_values.py), as vLLM's clients send them."""
    if text.strip().lower() in ("true", "false"):
        return True
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


# Values that are no number and no bool. null is left out: it leaves a key's default, as in vLLM's
# OpenAI server (docs/llm_model.md).
_WRONG_TYPE = st.one_of(st.text(max_size=6).filter(lambda t: not _reads_as_value(t)),
                        st.lists(st.integers(0, 9), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2))
_NOT_NUMBER = st.one_of(_WRONG_TYPE, st.booleans())
# an integral float is read as the integer (3.0 as 3)
_NOT_INT = st.one_of(_NOT_NUMBER, st.floats(**FINITE).filter(lambda v: not v.is_integer()),
                     st.integers(-BIG, INT64[0] - 1), st.integers(INT64[1] + 1, BIG))


def _below(bound, inclusive=False):
    # filtered, not exclude_max: hypothesis orders -0.0 below 0.0, Python does not
    return st.floats(max_value=bound, **FINITE).filter(lambda v: v <= bound if inclusive else v < bound)


def _above(bound):
    return st.floats(min_value=bound, **FINITE).filter(lambda v: v > bound)


BAD_VALUES = {
    "temperature": st.one_of(_below(0.0), _NOT_NUMBER),
    "top_p": st.one_of(_below(0.0, inclusive=True), _above(1.0), _NOT_NUMBER),
    "min_p": st.one_of(_below(0.0), _above(1.0), _NOT_NUMBER),
    "repetition_penalty": st.one_of(_below(0.0, inclusive=True), _NOT_NUMBER),
    "presence_penalty": st.one_of(_below(-2.0), _above(2.0), _NOT_NUMBER),
    "frequency_penalty": st.one_of(_below(-2.0), _above(2.0), _NOT_NUMBER),
    "top_k": _NOT_INT,
    "seed": _NOT_INT,
    "max_tokens": st.one_of(_NOT_INT, st.integers(-BIG, 0), st.integers(MAX_MODEL_LEN, BIG)),
    "min_tokens": st.one_of(_NOT_INT, st.integers(-BIG, -1), st.integers(17, BIG)),  # > 16, the default max
    "stop": st.one_of(_INT, st.floats(**FINITE), st.booleans(),
                      st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
                      st.lists(st.one_of(st.just(""), _INT), min_size=1, max_size=3)),
    "stop_token_ids": st.one_of(_INT, st.text(max_size=4), st.lists(
        st.one_of(st.integers(-BIG, -1), st.integers(1 << 40, BIG), st.text(max_size=2), st.floats(**FINITE)),
        min_size=1, max_size=3)),
    "truncate_prompt_tokens": st.one_of(_NOT_INT, st.integers(-BIG, -2), st.just(0)),
    # an integer N from 0 to 20 (or its string), or a bool
    "logprobs": st.one_of(st.integers(-BIG, -1), st.integers(21, BIG), st.text("xyz", max_size=4),
                          st.floats(**FINITE).filter(lambda v: not v.is_integer()),
                          st.lists(st.booleans(), max_size=2)),
    # the same, and no bool
    "prompt_logprobs": st.one_of(st.integers(-BIG, -1), st.integers(21, BIG), st.text("xyz", max_size=4),
                                 st.floats(**FINITE).filter(lambda v: not v.is_integer()), st.booleans()),
    "allowed_token_ids": st.one_of(_INT, st.just([]), st.text("xyz", max_size=4), st.lists(
        st.one_of(st.integers(-BIG, -1), st.integers(1 << 20, BIG),
                  st.floats(**FINITE).filter(lambda v: not v.is_integer())), min_size=1, max_size=3)),
    # not an object, keys that are no token id or past the vocabulary, biases outside [-100, 100]
    "logit_bias": st.one_of(
        _INT, st.booleans(), st.lists(_INT, max_size=2),
        st.text(max_size=4).filter(lambda t: not _parses_as_object(t)),
        st.dictionaries(st.from_regex(r"\A[a-z-]{1,4}\Z"), st.integers(-100, 100), min_size=1, max_size=2),
        st.dictionaries(st.integers(0, 9).map(str),
                        st.one_of(_below(-100.0), _above(100.0), st.text("xyz", min_size=1)), min_size=1, max_size=2),
        st.dictionaries(st.integers(1 << 20, BIG).map(str), st.integers(-100, 100), min_size=1, max_size=2)),
    **{name: st.one_of(_INT, st.text(max_size=4).filter(lambda t: not _reads_as_value(t)),
                       st.lists(st.booleans(), max_size=2))
       for name in BOOLEAN},
}


def _parses_as_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def sampling_json() -> st.SearchStrategy[tuple[bytes, tuple[str, ...]]]:
    """(raw sampling_parameters, the words one of which the error must contain)."""
    here = ("sampling_parameters",)
    key_value = st.sampled_from(sorted(BAD_VALUES)).flatmap(
        lambda k: BAD_VALUES[k].map(lambda v: (json.dumps({k: v}).encode(), (k,))))
    unknown = st.from_regex(r"\A[a-z][a-z_]{0,15}\Z").filter(lambda k: k not in KNOWN).map(
        lambda k: (json.dumps({k: 1}).encode(), (k,)))
    constant = st.tuples(st.sampled_from(NUMERIC), st.sampled_from(["NaN", "Infinity", "-Infinity"])).map(
        lambda t: (f'{{"{t[0]}": {t[1]}}}'.encode(), here))
    overflow = st.sampled_from(NUMERIC + BOOLEAN).map(lambda k: (f'{{"{k}": 1e400}}'.encode(), (k,)))
    digits = st.tuples(st.sampled_from(NUMERIC), st.integers(33, 5000)).map(
        lambda t: (f'{{"{t[0]}": {"9" * t[1]}}}'.encode(), here))
    duplicate = st.sampled_from(["temperature", "top_p", "max_tokens"]).map(
        lambda k: (f'{{"{k}": 1, "{k}": 1}}'.encode(), (f"has the key '{k}' more than once",)))
    deep = st.integers(1, (JSON_LIMIT - 2) // 2).map(lambda d: (b"[" * d + b"]" * d, here))
    deep_value = st.integers(1, (JSON_LIMIT - 20) // 2).map(
        lambda d: (b'{"temperature": ' + b"[" * d + b"]" * d + b"}", ("temperature", *here)))
    not_object = st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=8), st.integers(), st.booleans(),
                           st.none(), st.floats(**FINITE)).map(lambda v: (json.dumps(v).encode(), here))
    garbage = st.text(max_size=40).filter(lambda s: not _parses_as_object(s)).map(lambda s: (s.encode(), here))
    not_utf8 = st.binary(min_size=1, max_size=40).filter(_not_utf8).map(lambda b: (b, here))
    too_big = st.integers(JSON_LIMIT + 1, JSON_LIMIT + 4096).map(lambda n: (b" " * (n - 2) + b"{}", here))
    return st.one_of(key_value, unknown, constant, overflow, digits, duplicate, deep, deep_value, not_object,
                     garbage, not_utf8, too_big)


def _json_value(raw: bytes):
    """`raw` as a JSON string for an HTTP body, or None where JSON cannot carry it."""
    return None if _not_utf8(raw) else raw.decode()


def generation_case(tensors: dict, fields: tuple[str, ...], body: dict | None) -> Case:
    return Case(tensors, fields, body if body is None else {**body, "stream": False})


def sampling_cases(base: dict, base_body: dict) -> st.SearchStrategy[Case]:
    """`base`: the tensors of an otherwise valid request; `base_body`: the same for HTTP."""
    def case(raw_fields):
        raw, fields = raw_fields
        text = _json_value(raw)
        body = None if text is None else {**base_body, "sampling_parameters": text}
        return generation_case({**base, "sampling_parameters": tensor(raw, "BYTES")}, fields, body)
    return sampling_json().map(case)


def max_tokens_cases(base: dict, base_body: dict) -> st.SearchStrategy[Case]:
    return st.one_of(st.integers(-(1 << 31), 0), st.integers(MAX_MODEL_LEN, (1 << 31) - 1)).map(
        lambda n: generation_case({**base, "max_tokens": tensor(n, "INT32")}, ("max_tokens",),
                                  {**base_body, "max_tokens": n}))


def _messages_json() -> st.SearchStrategy[bytes]:
    bad = st.one_of(
        st.just([]), st.lists(st.integers(), min_size=1, max_size=2), st.dictionaries(st.text(max_size=3), st.text(max_size=3)),
        st.lists(st.fixed_dictionaries({"role": st.just("user")}), min_size=1, max_size=2),          # no content
        st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(st.integers(), st.none(),
                                        st.lists(st.text(max_size=3), max_size=2))}), min_size=1, max_size=2),
        st.lists(st.fixed_dictionaries({"role": st.text(max_size=10).filter(
            lambda r: r not in ("system", "user", "assistant", "tool")), "content": st.text(max_size=5)}),
            min_size=1, max_size=2))
    return st.one_of(
        bad.map(lambda v: json.dumps(v).encode()),
        st.text(max_size=30).filter(lambda s: not s.strip().startswith("[")).map(str.encode),   # not JSON / not a list
        st.integers(1, 30000).map(lambda d: b"[" * d + b"]" * d),                               # nested lists
        st.binary(min_size=1, max_size=30).filter(_not_utf8),
        st.integers(MAX_PROMPT_BYTES + 1, MAX_PROMPT_BYTES + 100).map(lambda n: b" " * n))


def llm_cases() -> st.SearchStrategy[Case]:
    """Bad llm requests: sampling JSON, prompts, chat messages, max_tokens."""
    prompt = {"text_input": tensor(b"hello", "BYTES")}
    body = {"text_input": "hello"}

    def text_input(raw, fields):
        text = _json_value(raw)
        return generation_case({"text_input": tensor(raw, "BYTES")}, fields, None if text is None else {"text_input": text})

    def messages(raw):
        text = _json_value(raw)
        return generation_case({"messages": tensor(raw, "BYTES")}, ("messages",),
                               None if text is None else {"messages": text})

    return st.one_of(
        sampling_cases(prompt, body),
        max_tokens_cases(prompt, body),
        st.just(text_input(b"", ("text_input",))),
        st.binary(min_size=1, max_size=40).filter(_not_utf8).map(lambda b: text_input(b, ("text_input",))),
        st.integers(MAX_PROMPT_BYTES + 1, MAX_PROMPT_BYTES + 100).map(lambda n: text_input(b"a" * n, ("text_input",))),
        st.integers(2 * MAX_MODEL_LEN, 4 * MAX_MODEL_LEN).map(lambda n: text_input(b"word " * n, ("max_model_len",))),
        st.just(generation_case({"stream": tensor(False, "BOOL")}, ("text_input",), {})),       # no prompt at all
        st.just(generation_case({**prompt, "messages": tensor(CHAT.encode(), "BYTES")}, ("text_input",),
                                {**body, "messages": CHAT})),                                     # both
        _messages_json().map(messages))
