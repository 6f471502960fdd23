"""rag's answer_format "json": {"answer": text, "citations": [source numbers]}, the citations only
numbers of the sources the answer was given, over gRPC and HTTP, streamed or not."""
from __future__ import annotations

import json

import pytest

from ragstack.client import RagClient, RagstackError
from server_helpers import http_post

pytestmark = pytest.mark.server
QUESTION = "How is the KV cache divided into blocks?"


@pytest.fixture(params=["grpc", "http"])
def client(request, triton_server):
    url = triton_server.grpc_url if request.param == "grpc" else triton_server.http_url
    with RagClient(url, request.param) as c:
        yield c


def check(text: str, sources: list) -> None:
    answer = json.loads(text)
    assert set(answer) == {"answer", "citations"} and isinstance(answer["answer"], str)
    assert all(n in [s.n for s in sources] for n in answer["citations"]), (answer, sources)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "single"])
@pytest.mark.parametrize("top_n", [1, 3])
def test_a_json_answer_cites_only_the_sources_given(client, stream, top_n):
    for seed in range(3):
        answer = client.query(QUESTION, top_n=top_n, sampling_parameters={"temperature": 1.0, "seed": seed},
                              max_tokens=200, stream=stream, answer_format="json",
                              max_answer_chars=60).collect()
        assert answer.finish_reason == "stop", answer.text
        assert len(answer.sources) == top_n
        check(answer.text, answer.sources)


def test_http_generate_takes_answer_format(triton_server):
    status, body = http_post(triton_server.http_url, "/v2/models/rag/generate",
                             {"query": QUESTION, "answer_format": "json", "max_answer_chars": 40, "top_n": 2,
                              "max_tokens": 200})
    assert status == 200, body
    result = json.loads(body)
    answer = json.loads(result["text_output"])
    assert set(answer["citations"]) <= {1, 2} and result["finish_reason"] == "stop"


def test_a_json_answer_cut_by_max_tokens_ends_with_length(client):
    answer = client.query(QUESTION, max_tokens=3, answer_format="json").collect()
    assert answer.finish_reason == "length" and answer.text.startswith("{")


@pytest.mark.parametrize("kwargs, message", [
    ({"answer_format": "xml"}, "answer_format: 'xml' is not one of ['text', 'json']"),
    ({"answer_format": "json", "max_answer_chars": 0}, "max_answer_chars: 0 is out of range; it must be 1 to 2000"),
    ({"answer_format": "json", "sampling_parameters": {"guided_regex": "a"}},
     "answer_format 'json' sets the output's schema; remove ['guided_regex'] from sampling_parameters"),
])
def test_a_bad_answer_format_is_invalid_arg(client, kwargs, message):
    with pytest.raises(RagstackError, match=message.replace("[", r"\[").replace("(", r"\(")) as info:
        client.query(QUESTION, **kwargs).collect()
    assert info.value.code == "INVALID_ARG"
