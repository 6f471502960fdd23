"""disconnect.EventStream: a client that reads none of a stream (its writes wait in uvicorn's flow control) is
taken as gone after write_timeout_s: the events stop, the iterator is closed (its Triton streams with it) and
the request counts as one the client left; a client that reads on is served to the end."""
from __future__ import annotations

import asyncio

from ragstack.openai_frontend import disconnect
from ragstack.openai_frontend.disconnect import CLIENT_GONE, EventStream


def run(send_delay_s: float, write_timeout_s: float, events: int = 5) -> tuple[dict, list, bool]:
    closed = False

    async def produce():
        nonlocal closed
        try:
            for i in range(events):
                yield f"data: {i}\n\n".encode()
        finally:
            closed = True

    sent = []

    async def send(message):
        if message["type"] == "http.response.body" and message["body"]:
            await asyncio.sleep(send_delay_s)   # a write waiting for the client to read
        sent.append(message)

    async def receive():
        await asyncio.Event().wait()   # the client never closes

    scope = {"type": "http", "path": "/v1/chat/completions"}
    asyncio.run(EventStream(produce(), write_timeout_s)(scope, receive, send))
    return scope, sent, closed


def test_a_client_that_reads_nothing_is_let_go_after_the_write_timeout(monkeypatch):
    monkeypatch.setattr(disconnect, "STALL_CHECK_S", 0.05)
    scope, sent, closed = run(send_delay_s=60, write_timeout_s=0.3)
    assert closed and scope["state"]["error_status"] == CLIENT_GONE
    assert [m["type"] for m in sent] == ["http.response.start"]   # the first event never went out


def test_a_client_that_reads_slowly_gets_every_event(monkeypatch):
    monkeypatch.setattr(disconnect, "STALL_CHECK_S", 0.05)
    scope, sent, closed = run(send_delay_s=0.1, write_timeout_s=0.3)
    assert closed and "state" not in scope
    assert [m.get("body") for m in sent[1:]] == [f"data: {i}\n\n".encode() for i in range(5)] + [b""]
