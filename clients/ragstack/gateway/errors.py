"""A request the gateway answers itself, in Triton's error shape: `{"error": "..."}`."""
from __future__ import annotations

import json

from aiohttp import web


class GatewayError(Exception):
    def __init__(self, status: int, message: str, retry_after_s: int | None = None, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.retry_after_s, self.close = status, message, retry_after_s, close

    def response(self) -> web.Response:
        response = web.Response(status=self.status, body=error_body(self.message), content_type="application/json")
        if self.retry_after_s is not None:
            response.headers["Retry-After"] = str(self.retry_after_s)
        if self.close:  # the client may still be sending: its connection is not reused
            response.force_close()
        return response


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()  # compact, as Triton writes it
