"""`GET /livez`: 200 only when Triton answers its repository index within livez_timeout_s.

Triton's own /v2/health/live answers 200 from a server whose crash handler has deadlocked; the index
goes through the model repository manager, so a wedged server fails it. The repository API needs the
admin key where one is set. Each probe opens a new connection (a wedged server may still accept one
but never answers it), and concurrent /livez calls share the probe under way.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from ragstack import admin_key
from ragstack.gateway.errors import GatewayError


class Livez:
    def __init__(self, upstream_address: str, key: str | None, timeout_s: float):
        self.url = f"http://{upstream_address}/v2/repository/index"
        self.headers = admin_key.headers("http", key)
        self.timeout_s = timeout_s
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self._probe: asyncio.Future | None = None

    async def handle(self, request: web.BaseRequest) -> web.Response:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._ask())
        problem = await asyncio.shield(self._probe)
        if problem:
            raise GatewayError(503, f"tritonserver is not live: {problem}")
        return web.json_response({"live": True})

    async def _ask(self) -> str | None:
        """None when Triton answered in time, else why not."""
        try:
            status, body = await asyncio.wait_for(self._index(), self.timeout_s)
        except asyncio.TimeoutError:
            return f"no answer to the repository index within {self.timeout_s:g} s (livez_timeout_s)"
        except aiohttp.ClientError as exc:
            return f"the repository index failed: {exc}"
        if status != 200:
            return f"the repository index answered {status}: {body[:200].decode(errors='replace')}"
        return None

    async def _index(self) -> tuple[int, bytes]:
        async with self._session.post(self.url, headers=self.headers, data=b"{}") as response:
            return response.status, await response.read()

    async def close(self) -> None:
        await self._session.close()
