"""The frontend's requests to a model of one's own, or to a Triton not yet upgraded: this project's own return
flags only where the model declares them (Triton refuses an input its model lacks); and the CORS setting."""
from __future__ import annotations

import pytest

from ragstack.openai_frontend import generation
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.models import kind_of


def config(*inputs: str) -> dict:
    return {"name": "mine", "input": [{"name": name} for name in inputs], "output": [{"name": "text_output"}]}


def test_return_stop_reason_goes_only_to_models_that_declare_it():
    inputs = generation.llm_inputs("hi", {}, stream=True, logprobs=False)
    old = kind_of(config("text_input", "messages", "stream", "sampling_parameters"))
    new = kind_of(config("text_input", "messages", "stream", "sampling_parameters", "return_stop_reason"))
    assert "return_stop_reason" not in generation.declared(inputs, old)
    assert "return_finish_reason" in generation.declared(inputs, old)   # vllm_backend's flags go as before
    assert generation.declared(inputs, new) == inputs


@pytest.mark.parametrize("origins", ["https://a.example.com", "*", "https://a.example.com, http://localhost:3000"])
def test_allowed_origins_take_origins_and_the_wildcard(origins):
    assert FrontendLimits(allowed_origins=origins).origins() == [o.strip() for o in origins.split(",")]


@pytest.mark.parametrize("origin", ["https://*.example.com", "a.example.com", "https://a.example.com/path"])
def test_allowed_origins_refuse_what_would_never_match(origin):
    with pytest.raises(ValueError, match="allowed_origins"):
        FrontendLimits(allowed_origins=origin)
