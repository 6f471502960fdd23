"""The last resort for a fault of the frontend's own: a 500 in OpenAI's shape, on a connection that stays usable.

Starlette's handler for `Exception` answers from its outermost middleware and then raises the exception again, so
uvicorn drops the connection and a keep-alive client's next request on it fails with a reset. This middleware, the
innermost, answers instead and does not raise, so the metrics and the guard see a plain 500. A fault after the
answer has started (inside a stream, which streaming.py already ends with an error event) is raised as before.
"""
from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragstack.openai_frontend.errors import internal

log = logging.getLogger("ragstack.openai_frontend")


class InternalErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:  # noqa: BLE001 - the frontend's own fault, answered as a 500
            if started:
                raise
            log.exception("failed: %s %s", scope.get("method"), scope.get("path"))
            await internal(exc).response()(scope, receive, send)
