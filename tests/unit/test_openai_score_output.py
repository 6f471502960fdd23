"""Which rerank output answers rerank and score (pooling_schemas.Scored.score_output): vLLM's activated score
unless use_activation is false; a model of one's own without activated_scores answers its scores, and refuses
an explicit true naming the field."""
from __future__ import annotations

import pytest

from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.models import Served, kind_of
from ragstack.openai_frontend.pooling_schemas import RerankRequest

BOTH = Served("rerank", "rerank", outputs=frozenset({"scores", "activated_scores", "truncated"}))
OWN = Served("mine", "rerank", outputs=frozenset({"scores"}))


def asked(**fields) -> RerankRequest:
    return RerankRequest(query="q", documents=["d"], **fields)


@pytest.mark.parametrize("fields, output", [
    ({}, "activated_scores"), ({"use_activation": True}, "activated_scores"),
    ({"use_activation": False}, "scores"), ({"activation": False}, "scores"), ({"softmax": False}, "scores"),
    ({"use_activation": True, "activation": False}, "scores"),   # vLLM's order: the older names win
    ({"use_activation": False, "activation": True}, "activated_scores"),
    ({"activation": True, "softmax": False}, "scores"),
    ({"use_activation": None, "softmax": False}, "scores"),
])
def test_the_activated_score_unless_asked_not_to(fields, output):
    assert asked(**fields).score_output(BOTH) == output


def test_a_model_without_activated_scores_answers_its_own():
    assert asked().score_output(OWN) == "scores"
    assert asked(use_activation=False).score_output(OWN) == "scores"
    for name in ("use_activation", "activation", "softmax"):
        with pytest.raises(APIError) as refused:
            asked(**{name: True}).score_output(OWN)
        assert refused.value.param == name and "model 'mine'" in refused.value.message
        assert "no activated_scores output" in refused.value.message


def test_the_served_rerank_model_lists_its_outputs():
    config = {"name": "rerank", "input": [{"name": "query"}, {"name": "passages"}],
              "output": [{"name": "scores"}, {"name": "activated_scores"}, {"name": "truncated"}]}
    assert kind_of(config).outputs == {"scores", "activated_scores", "truncated"}
