"""ASGI middleware: every answer carries `x-request-id`, as OpenAI's do and vLLM's with
--enable-request-id-headers: the client's own `x-request-id` when it sent a usable one (visible ASCII, no
spaces, up to MAX_REQUEST_ID_CHARS), else a new uuid4. The SDKs read it into a completion's `_request_id` and an
error's `request_id`, what users quote in a bug report."""
from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragstack.openai_frontend.schemas import MAX_REQUEST_ID_CHARS

HEADER = b"x-request-id"


class RequestId:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == HEADER), b"")
        request_id = given if _usable(given) else uuid.uuid4().hex.encode()

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", []) if name != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id)]}
            await send(message)

        await self.app(scope, receive, with_id)


def _usable(value: bytes) -> bool:
    return 0 < len(value) <= MAX_REQUEST_ID_CHARS and all(0x21 <= byte <= 0x7E for byte in value)
