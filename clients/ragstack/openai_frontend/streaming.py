"""Streamed answers as OpenAI sends them: `data: {chunk}` events, then `data: [DONE]`.

The response starts once every choice has its first piece, so a request the llm refuses at once (a bad
sampling value, a full queue) is answered with its HTTP status, as when not streaming; an error after
that arrives as a `data: {"error": ...}` event, which the OpenAI SDKs raise.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.requests import Request

from ragstack.openai_frontend import metrics
from ragstack.openai_frontend.disconnect import EventStream, unless_gone
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.generation import Piece

DONE = b"data: [DONE]\n\n"


class Chunks(Protocol):
    def piece(self, index: int, piece: Piece) -> dict | None:
        """The chunk for a choice's piece, None if it says nothing."""

    def end(self) -> list[dict]:
        """Chunks after the last piece (usage)."""


def event(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


async def answer(request: Request, stream: AsyncIterator[tuple[int, Piece]], choices: int,
                 chunks: Chunks) -> EventStream:
    try:
        first = await unless_gone(request, _until_each_started(stream, choices))
    except BaseException:
        await stream.aclose()
        raise
    return EventStream(_events(request, first, stream, chunks))


async def _until_each_started(stream: AsyncIterator[tuple[int, Piece]], choices: int) -> list[tuple[int, Piece]]:
    seen, pieces = set(), []
    while len(seen) < choices:
        try:
            item = await stream.__anext__()
        except StopAsyncIteration:
            break
        pieces.append(item)
        seen.add(item[0])
    return pieces


async def _events(request: Request, first: list[tuple[int, Piece]], stream: AsyncIterator[tuple[int, Piece]],
                  chunks: Chunks) -> AsyncIterator[bytes]:
    async def all_pieces():
        for item in first:
            yield item
        async for item in stream:
            yield item

    try:
        async with contextlib.aclosing(all_pieces()) as pieces:
            async for index, piece in pieces:
                chunk = chunks.piece(index, piece)
                if chunk is not None:
                    if piece.text:
                        metrics.first_token(request)
                    yield event(chunk)
        for chunk in chunks.end():
            yield event(chunk)
    except APIError as exc:
        metrics.failed(request, exc.status)
        yield exc.event()
    finally:
        await stream.aclose()
    yield DONE
