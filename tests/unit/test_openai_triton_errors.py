"""errors.from_triton: a Triton error as OpenAI's error object, without the ensemble's and Triton's framing
whatever the status (a client reads what the model said)."""
from __future__ import annotations

from ragstack.openai_frontend.errors import from_triton


def test_an_overload_through_an_ensemble_reads_as_the_step_said_it():
    error = from_triton("in ensemble 'rag', rag_generate: 256 requests in flight, the limit (parameter "
                        "max_inflight)", "StatusCode.UNAVAILABLE")
    assert error.status == 503 and error.code == "unavailable"
    assert error.message == "rag_generate: 256 requests in flight, the limit (parameter max_inflight)"


def test_an_overload_waits_a_second_what_is_not_ready_five():
    """Retry-After: an overload (the llm's full queue, rag_generate's max_inflight: "retry later") clears as
    requests finish; an engine restarting takes seconds, which the SDKs' two retries must outlast."""
    full = from_triton("waiting queue is full (max_waiting=2); retry later", None)
    restarting = from_triton("the engine is restarting after a failure (killed); retry in a few seconds",
                             "StatusCode.UNAVAILABLE")
    assert (full.status, full.code, full.response().headers["retry-after"]) == (503, "overloaded", "1")
    queued = from_triton("in ensemble 'rag', Exceeds maximum queue size", None)
    assert (queued.status, queued.code, queued.response().headers["retry-after"]) == (503, "overloaded", "1")
    assert (restarting.status, restarting.code, restarting.response().headers["retry-after"]) == (
        503, "unavailable", "5")


def test_a_refusal_names_the_request_field_it_came_from():
    error = from_triton("in ensemble 'rag', text[0] is 18000 bytes; the limit is 16384", "StatusCode.INVALID_ARGUMENT",
                        {"text": "messages[1].content"})
    assert (error.status, error.param, error.message) == (
        400, "messages[1].content", "messages[1].content is 18000 bytes; the limit is 16384")
    error = from_triton("query: 2001 characters; the limit is 2000", None, {"query": "messages[1].content"})
    assert (error.param, error.message) == ("messages[1].content", "messages[1].content: 2001 characters; the limit "
                                                                   "is 2000")
    item = from_triton("passages[3] is 20000 bytes; the limit is 16384", None, {"passages": "documents"})
    assert (item.param, item.message) == ("documents", "documents[3] is 20000 bytes; the limit is 16384")
    wiring = from_triton("query: hybrid retrieval needs the question's text", None, {"query": "messages[1].content"})
    assert wiring.message == "query: hybrid retrieval needs the question's text"   # not about the value: as it is
    same = from_triton("top_k: 0 is out of range", "StatusCode.INVALID_ARGUMENT", {"top_k": "top_k"})
    assert (same.param, same.message) == ("top_k", "top_k: 0 is out of range")   # a field of the same name: as it is


def test_a_refusal_reads_in_the_request_fields_words():
    """The model's own name for a field, as the subject or an input, becomes the request's."""
    error = from_triton("logprobs must be in [0, 20], got 21", "StatusCode.INVALID_ARGUMENT",
                        {"logprobs": "top_logprobs"})
    assert (error.param, error.message) == ("top_logprobs", "top_logprobs must be in [0, 20], got 21")
    error = from_triton("input 'prompt_token_ids' holds 99999 at index 1; the vocabulary has 500 tokens",
                        "StatusCode.INVALID_ARGUMENT", {"prompt_token_ids": "tokens"})
    assert (error.param, error.message) == ("tokens", "input 'tokens' holds 99999 at index 1; the vocabulary has "
                                                      "500 tokens")
    # other words stay: "structured output" is no field's subject
    error = from_triton("structured output: the constraint allows no output", "StatusCode.INVALID_ARGUMENT",
                        {"structured": "response_format"})
    assert (error.param, error.message) == ("response_format", "structured output: the constraint allows no output")


def test_an_unknown_key_is_named_whole_whatever_its_characters():
    for key in ("foo-bar", "x.y", "é-x"):
        message = f"unknown sampling parameter(s) ['{key}']; known: ['max_tokens']"
        assert from_triton(message, "StatusCode.INVALID_ARGUMENT").param == key
    cut = "unknown sampling parameter(s) ['" + "k" * 61 + "...', 'x0'] and 3 more; known: ['max_tokens']"
    assert from_triton(cut, "StatusCode.INVALID_ARGUMENT").param == "k" * 61
