"""InternalErrors: a fault of the frontend's own is a 500 in OpenAI's shape that is not raised again (raised, it
made uvicorn drop the connection: a keep-alive client's next request failed with a reset)."""
from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ragstack.openai_frontend.internal_errors import InternalErrors


async def broken(request):
    raise KeyError("lost")


async def broken_midway(request):
    async def body():
        yield b"data: 1\n\n"
        raise KeyError("lost midway")
    return StreamingResponse(body(), media_type="text/event-stream")


def client() -> TestClient:
    app = Starlette(routes=[Route("/broken", broken, methods=["POST"]), Route("/midway", broken_midway)])
    app.add_middleware(InternalErrors)
    return TestClient(app, raise_server_exceptions=True)   # an exception raised again would fail the request


def test_a_fault_before_the_answer_is_a_500_not_raised_again():
    with client() as http:
        for _ in range(2):   # the same connection answers again
            answer = http.post("/broken", json={})
            assert answer.status_code == 500
            assert answer.json()["error"] == {"message": "internal error: KeyError: 'lost'", "type": "server_error",
                                              "param": None, "code": None}


def test_a_fault_after_the_answer_started_is_raised_as_before():
    with client() as http, pytest.raises(KeyError, match="lost midway"):
        http.get("/midway")
