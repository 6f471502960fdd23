"""`GET /livez`: 200 only when Triton answers its repository index within livez_timeout_s. `GET /readyz`:
200 when, besides, a model is READY, none is LOADING or UNLOADING, and none it served has failed since.

Triton's own /v2/health/live answers 200 from a server whose crash handler has deadlocked; the index
goes through the model repository manager, so a wedged server fails it. Triton's /v2/health/ready (strict
readiness) stays false after any model's failed load until that model loads (2.51), though every other
model serves: /readyz is the readiness to probe once a server has started (its startup: Triton's own,
which needs every model it was told to load). The repository API needs the admin key where one is set.
Each probe opens a new connection (a wedged server may still accept one but never answers it), and
concurrent /livez and /readyz calls share the probe under way.
"""
from __future__ import annotations

import asyncio
import json

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
        self._served: set[str] = set()   # every model this server has been seen serving (READY)

    async def handle(self, request: web.BaseRequest, ready: bool = False) -> web.Response:
        """/livez, or /readyz with `ready`."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._ask())
        problem, models = await asyncio.shield(self._probe)
        if problem:
            raise GatewayError(503, f"tritonserver is not live: {problem}")
        if not ready:
            return web.json_response({"live": True})
        self._served.update(m.get("name") for m in models if m.get("state") == "READY")
        problem = readiness_problem(models, self._served)
        if problem:
            raise GatewayError(503, f"tritonserver is not ready: {problem}")
        return web.json_response({"ready": True})

    async def _ask(self) -> tuple[str | None, list[dict]]:
        """(None, the index's models) when Triton answered in time, else (why not, [])."""
        try:
            status, body = await asyncio.wait_for(self._index(), self.timeout_s)
        except asyncio.TimeoutError:
            return f"no answer to the repository index within {self.timeout_s:g} s (livez_timeout_s)", []
        except aiohttp.ClientError as exc:
            return f"the repository index failed: {exc}", []
        if status != 200:
            return f"the repository index answered {status}: {body[:200].decode(errors='replace')}", []
        try:
            models = json.loads(body)
        except ValueError:
            return f"the repository index answered no JSON: {body[:200].decode(errors='replace')}", []
        return None, models if isinstance(models, list) else []

    async def _index(self) -> tuple[int, bytes]:
        async with self._session.post(self.url, headers=self.headers, data=b"{}") as response:
            return response.status, await response.read()

    async def close(self) -> None:
        await self._session.close()


def readiness_problem(models: list[dict], served: set[str]) -> str | None:
    """Why a server whose index lists `models` should take no traffic now, or None: no model READY, one
    LOADING or UNLOADING (a version changing under the requests), or one it served (`served`) that failed
    since. A model unloaded on purpose, or one that failed its first load here, leaves the others serving."""
    moving = [f"{m.get('name')} {m.get('state')}" for m in models if m.get("state") in ("LOADING", "UNLOADING")]
    if moving:
        return ", ".join(moving[:5])
    failed = [f"{m.get('name')} failed: {str(m.get('reason'))[:200]}" for m in models
              if m.get("name") in served and m.get("state") == "UNAVAILABLE" and m.get("reason") != "unloaded"]
    if failed:
        return "; ".join(failed[:3])
    if not any(m.get("state") == "READY" for m in models):
        return "no model is READY"
    return None
