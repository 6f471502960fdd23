"""errors.from_triton: a Triton error as OpenAI's error object, without the ensemble's and Triton's framing
whatever the status (a client reads what the model said)."""
from __future__ import annotations

from ragstack.openai_frontend.errors import from_triton


def test_an_overload_through_an_ensemble_reads_as_the_step_said_it():
    error = from_triton("in ensemble 'rag', rag_generate: 256 requests in flight, the limit (parameter "
                        "max_inflight)", "StatusCode.UNAVAILABLE")
    assert error.status == 503 and error.code == "unavailable"
    assert error.message == "rag_generate: 256 requests in flight, the limit (parameter max_inflight)"


def test_a_refusal_names_the_request_field_it_came_from():
    error = from_triton("in ensemble 'rag', text[0] is 18000 bytes; the limit is 16384", "StatusCode.INVALID_ARGUMENT",
                        {"text": "messages"})
    assert (error.status, error.param, error.message) == (400, "messages", "text[0] is 18000 bytes; the limit is 16384")
