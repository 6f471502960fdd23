"""ASGI middleware in front of the API: the API key, then the bound on requests served at once
(max_inflight: past it 503 with Retry-After). Health (and vLLM's /ping), the version and the metrics stay
open, as Triton's do."""
from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ragstack.openai_frontend import keys
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.inflight import Inflight

OPEN = ("/health", "/ping", "/version", "/metrics")


class Guard:
    def __init__(self, app: ASGIApp, inflight: Inflight, api_key: str | None):
        self.app, self.inflight, self.api_key = app, inflight, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN:
            await self.app(scope, receive, send)
            return
        try:
            headers = dict(scope["headers"])
            keys.check_bearer(headers.get(b"authorization", b"").decode("latin-1"), self.api_key)
            if self.inflight.full():
                raise APIError(503, f"{self.inflight.total()} requests in flight, the limit (max_inflight); retry "
                                    "later", code="overloaded")
        except APIError as exc:
            await exc.response()(scope, receive, send)
            return
        self.inflight.add(1)
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight.add(-1)
