"""vLLM sampling keys this engine does not implement (backends/triton_llm/sampling_values.py): at vLLM's default,
which asks for nothing the engine does not do anyway, they pass and are dropped (vLLM's own request models send
every key); any other value is refused naming the key, as before. include_stop_str_in_output, once among them,
is an engine setting now: either value reaches the engine."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from sampling_values import SamplingValueError, coerce  # noqa: E402

from llm_engine.sampling_params import SamplingParams  # noqa: E402
from ragstack.error_codes import code_from_message  # noqa: E402

# vLLM's defaults (vllm/sampling_params.py, the OpenAI server's request models), as JSON or vllm_backend's strings.
DEFAULTS = [
    ("best_of", 1), ("best_of", "1"), ("best_of", 1.0), ("use_beam_search", False), ("use_beam_search", "false"),
    ("length_penalty", 1.0), ("length_penalty", 1), ("length_penalty", "1.0"), ("early_stopping", False),
    ("early_stopping", "False"), ("spaces_between_special_tokens", True), ("spaces_between_special_tokens", "true"),
    ("bad_words", []), ("bad_words", "[]"), ("detokenize", True), ("detokenize", "true"),
    ("guided_whitespace_pattern", None),
    *((key, None) for key in ("best_of", "use_beam_search", "length_penalty", "early_stopping", "bad_words",
                              "spaces_between_special_tokens", "detokenize")),
]


@pytest.mark.parametrize("key, value", DEFAULTS)
def test_a_no_op_default_passes_and_is_dropped(key, value):
    out = coerce({key: value, "temperature": "0.5"}, "sampling_parameters")
    assert out == {"temperature": 0.5}
    SamplingParams.from_dict(out)  # nothing the engine refuses reaches it


@pytest.mark.parametrize("key, value, what", [
    ("best_of", 2, "best_of > 1"), ("best_of", 0, "best_of > 1"), ("best_of", True, "best_of > 1"),
    ("use_beam_search", True, "beam search"), ("use_beam_search", "yes", "beam search"),
    ("length_penalty", 0.5, "beam search's length_penalty"), ("length_penalty", True, "length_penalty"),
    ("early_stopping", True, "beam search's early_stopping"), ("early_stopping", "never", "early_stopping"),
    ("spaces_between_special_tokens", False, "spaces_between_special_tokens"),
    ("bad_words", ["x"], "bad_words"), ("bad_words", "x", "bad_words"), ("bad_words", "", "bad_words"),
    ("detokenize", False, "detokenize"),
    ("guided_whitespace_pattern", " ", "a whitespace pattern"), ("guided_whitespace_pattern", "", "whitespace"),
])
def test_any_other_value_is_refused_naming_the_key(key, value, what):
    with pytest.raises(SamplingValueError) as refused:
        coerce({key: value}, "parameters")
    message = str(refused.value)
    assert message.startswith(f"parameters: '{key}' is a vLLM sampling parameter this engine does not implement ("), \
        message
    assert what in message
    assert code_from_message(message) == "INVALID_ARG"


@pytest.mark.parametrize("value, kept", [(True, True), ("true", True), (False, False), ("false", False)])
def test_include_stop_str_in_output_reaches_the_engine_either_way(value, kept):
    """An engine setting now, not a no-op default: true keeps the stop string in the output text."""
    out = coerce({"include_stop_str_in_output": value}, "sampling_parameters")
    assert out == {"include_stop_str_in_output": kept}
    assert SamplingParams.from_dict(out).include_stop_str_in_output is kept
    assert coerce({"include_stop_str_in_output": None}, "sampling_parameters") == {}   # null: the default


@pytest.mark.parametrize("value", [1, "yes", [True]])
def test_include_stop_str_in_output_takes_a_flag_only(value):
    with pytest.raises(SamplingValueError, match="'include_stop_str_in_output' must be true or false"):
        coerce({"include_stop_str_in_output": value}, "parameters")
