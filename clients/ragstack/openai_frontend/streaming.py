"""Streamed answers as OpenAI sends them: `data: {chunk}` events, then `data: [DONE]`.

The response starts once every choice has its first piece, so a request the llm refuses at once (a bad
sampling value, a full queue) is answered with its HTTP status, as when not streaming; an error after
that arrives as a `data: {"error": ...}` event, which the OpenAI SDKs raise, then `[DONE]`: so does a
fault of the frontend's own (a 500 in the event).
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.requests import Request

from ragstack.openai_frontend import metrics
from ragstack.openai_frontend.disconnect import EventStream, unless_gone
from ragstack.openai_frontend.errors import APIError, internal
from ragstack.openai_frontend.generation import Piece, coalesced

DONE = b"data: [DONE]\n\n"
log = logging.getLogger("ragstack.openai_frontend")


class Chunks(Protocol):
    def piece(self, index: int, piece: Piece) -> list[dict]:
        """The chunks for a choice's piece, none if it says nothing."""

    def end(self) -> list[dict]:
        """Chunks after the last piece (usage)."""


def event(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


async def answer(request: Request, stream: AsyncIterator[list[tuple[int, Piece]]], choices: int,
                 chunks: Chunks, write_timeout_s: float) -> EventStream:
    """`stream`: generation.merged's batches of pieces; write_timeout_s: FrontendLimits'."""
    try:
        first = await unless_gone(request, _until_each_started(stream, choices))
    except BaseException:
        await stream.aclose()
        raise
    return EventStream(_events(request, first, stream, chunks), write_timeout_s)


async def _until_each_started(stream: AsyncIterator[list[tuple[int, Piece]]],
                              choices: int) -> list[tuple[int, Piece]]:
    seen, pieces = set(), []
    while len(seen) < choices:
        try:
            batch = await stream.__anext__()
        except StopAsyncIteration:
            break
        pieces += batch
        seen.update(index for index, _ in batch)
    return pieces


async def _events(request: Request, first: list[tuple[int, Piece]], stream: AsyncIterator[list[tuple[int, Piece]]],
                  chunks: Chunks) -> AsyncIterator[bytes]:
    """Each batch of pieces as one write: a choice's pieces in it added up into one chunk (coalesced), so
    a client or a frontend that falls behind catches up with fewer, larger chunks rather than queueing."""
    async def all_batches():
        yield first
        async for batch in stream:
            yield batch

    try:
        async with contextlib.aclosing(all_batches()) as batches:
            async for batch in batches:
                events = []
                for index, piece in coalesced(batch):
                    said = chunks.piece(index, piece)
                    if said and piece.text:
                        metrics.first_token(request)   # observed once, at the first
                    events += [event(chunk) for chunk in said]
                if events:
                    yield b"".join(events)
        tail = b"".join(event(chunk) for chunk in chunks.end())
    except APIError as exc:
        metrics.failed(request, exc.status)
        tail = exc.event()
    except Exception as exc:   # a fault of the frontend's own after the 200: the stream still ends as OpenAI's do
        log.exception("failed in a stream: %s %s", request.method, request.url.path)
        metrics.failed(request, 500)
        tail = internal(exc).event()
    finally:
        await stream.aclose()
    yield tail + DONE
