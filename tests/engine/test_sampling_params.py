import pytest

from llm_engine.sampling_params import SamplingParams


def test_defaults_are_valid_and_sampling():
    p = SamplingParams()
    assert not p.is_greedy and p.max_tokens == 16 and p.stop == []
    assert SamplingParams(temperature=0).is_greedy


def test_stop_string_becomes_a_list():
    assert SamplingParams(stop="###").stop == ["###"]


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -0.1, "temperature must be >= 0 (0 = greedy), got -0.1"),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
    ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
    ("min_p", 1.2, "min_p must be in [0, 1], got 1.2"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0.0"),
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3"),
    ("max_tokens", 0, "max_tokens must be >= 1, got 0"),
    ("min_tokens", -1, "min_tokens must be >= 0, got -1"),
    ("top_k", 1.5, "top_k must be an integer, got 1.5"),
    ("seed", "7", "seed must be an integer, got '7'"),
    ("temperature", "hot", "temperature must be a number, got 'hot'"),
    ("temperature", True, "temperature must be a number, got True"),
    ("stop", [""], "stop must be a list of non-empty strings"),
    ("stop_token_ids", [-1], "stop_token_ids must be non-negative integers"),
    ("ignore_eos", 1, "ignore_eos must be a bool, got 1"),
    ("temperature", float("nan"), "temperature must be a finite number, got nan"),
    ("repetition_penalty", float("inf"), "repetition_penalty must be a finite number, got inf"),
    ("temperature", 10 ** 400, "temperature must be a finite number"),
    ("top_k", 1 << 63, "top_k must fit in 64 bits"),
    ("seed", -(1 << 64), "seed must fit in 64 bits"),
    ("stop", 5, "stop must be a list, got 5"),
    ("stop", {"a": 1}, "stop must be a list, got {'a': 1}"),
    ("stop_token_ids", 5, "stop_token_ids must be a list, got 5"),
    ("logit_bias", [5], "logit_bias must be an object of token id -> bias, got [5]"),
    ("logit_bias", {"x": 1}, "logit_bias keys must be token ids (non-negative integers or their decimal strings), "
                             "got 'x'"),
    ("logit_bias", {-1: 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {"-1": 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {True: 1}, "logit_bias keys must be token ids"),
    ("logit_bias", {"5": 101}, "logit_bias['5'] must be a number in [-100, 100], got 101"),
    ("logit_bias", {5: float("nan")}, "logit_bias[5] must be a number in [-100, 100], got nan"),
    ("logit_bias", {5: "1"}, "logit_bias[5] must be a number in [-100, 100], got '1'"),
    ("logit_bias", {5: 1, "5": 2}, "logit_bias names token id 5 twice"),
    ("allowed_token_ids", [], "allowed_token_ids must be a non-empty list of non-negative integers, got []"),
    ("allowed_token_ids", [1, -1], "allowed_token_ids must be a non-empty list of non-negative integers"),
    ("allowed_token_ids", "12", "allowed_token_ids must be a non-empty list"),
    ("truncate_prompt_tokens", 0, "truncate_prompt_tokens must be >= 1 or -1 (max_model_len), got 0"),
    ("truncate_prompt_tokens", -2, "truncate_prompt_tokens must be >= 1 or -1"),
    ("truncate_prompt_tokens", 1.5, "truncate_prompt_tokens must be an integer, got 1.5"),
])
def test_invalid_values_name_field_value_and_limit(field, value, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**{field: value})
    assert message in str(err.value)


def test_min_tokens_cannot_exceed_max_tokens():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens=4, got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_from_dict_accepts_known_keys():
    p = SamplingParams.from_dict({"temperature": 0, "max_tokens": 3, "stop": ["x"], "seed": 1})
    assert p.is_greedy and p.max_tokens == 3 and p.stop == ["x"] and p.seed == 1


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"unknown sampling parameter\(s\) \['best_of'\]"):
        SamplingParams.from_dict({"best_of": 2})


def test_from_dict_rejects_invalid_values_and_non_dicts():
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5"):
        SamplingParams.from_dict({"top_p": 1.5})
    with pytest.raises(ValueError, match="must be a dict"):
        SamplingParams.from_dict([("top_p", 0.5)])


def test_logit_bias_keys_are_read_as_token_ids():
    assert SamplingParams(logit_bias={"50256": -100, 7: 2.5, " 3": 100}).logit_bias == {50256: -100.0, 7: 2.5, 3: 100.0}
    assert SamplingParams.from_dict({"logit_bias": {}}).logit_bias == {}


def test_allowed_token_ids_and_structured_output_do_not_combine():
    with pytest.raises(ValueError, match="allowed_token_ids cannot be combined with structured output"):
        SamplingParams(allowed_token_ids=[1, 2], structured_outputs={"choice": ["a", "b"]})


def test_unknown_keys_are_named_briefly():
    """Names come from clients: a few, each cut short, so the message stays small."""
    with pytest.raises(ValueError) as info:
        SamplingParams.from_dict({"k" * 60_000: 1, **{f"x{i}": 1 for i in range(10)}})
    message = str(info.value)
    assert len(message) < 2000 and f"['{'k' * 61}...', 'x0'" in message and "and 3 more" in message
