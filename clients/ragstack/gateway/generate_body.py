"""The JSON bodies of Triton's generate endpoints, made safe before Triton converts them to tensors.

1. Types. Triton turns every key that names one of the model's inputs, at the top level or inside
   "parameters", into that input's tensor, and answers a value of the wrong JSON type with a 500.
   Strings holding a number or "true"/"false" (what vllm_backend's clients send) are converted to
   the input's type here; any other mismatch is answered 400 naming the key, the value and the type.
2. Cancellation. Triton 2.51 notices a client that went away only after the request's first
   response, so a request that answers once (stream false) ran to its end for nobody. Each generate
   body gets a cancel key (parameters.ragstack_cancel_key, which the llm and rag_generate honour);
   when the client goes away the gateway sends the llm behind the model a request to abort it
   (parameters.ragstack_abort). The llm behind a model: the model itself if its backend is
   triton_llm, else the models its ensemble steps or its `llm_model` parameter name, found from the
   models' configs and kept for a minute. The lookup starts as the request arrives, in the background,
   so that an abort is sent at once, not after walking an ensemble's configs.
3. Nested parameters. Triton takes only strings, numbers and bools in "parameters"; an object or a
   list there (a JSON schema in guided_json, a list in guided_choice or stop) is passed as its JSON
   text, which the llm reads as the value itself.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import aiohttp

from ragstack.gateway.errors import GatewayError

GENERATE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/generate(?:_stream)?$")
CANCEL_KEY, ABORT_KEY = "ragstack_cancel_key", "ragstack_abort"
CACHE_S = 60.0
MAX_CACHED = 512  # entries per cache: model names come from request paths, which anyone can vary
_INTEGER_RANGES = {"INT8": 8, "INT16": 16, "INT32": 32, "INT64": 64, "UINT8": 8, "UINT16": 16, "UINT32": 32,
                   "UINT64": 64}


class GenerateBodies:
    def __init__(self, session: aiohttp.ClientSession, address: str):
        self.session, self.address = session, address
        self._cache: dict[str, tuple[float, dict | None]] = {}
        self._llm_lookups: dict[str, tuple[float, asyncio.Task]] = {}
        self._aborts: set[asyncio.Task] = set()

    async def prepare(self, model: str, version: str | None, body: bytes) -> tuple[bytes, str | None]:
        """The body to send (types converted, a cancel key added) and its cancel key; the body as it
        is where it is not a JSON object (Triton answers that)."""
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return body, None
        if not isinstance(request, dict):
            return body, None
        self._llms_of(model)
        metadata = await self._json(f"/v2/models/{model}" + (f"/versions/{version}" if version else ""))
        inputs = {i["name"]: i["datatype"] for i in metadata.get("inputs", [])} if metadata else {}
        parameters = request.get("parameters")
        for where, values in (("", request), ("parameters.", parameters if isinstance(parameters, dict) else {})):
            for key in [k for k in values if k in inputs]:
                values[key] = _typed(where + key, values[key], inputs[key])
        if parameters is None:
            parameters = request["parameters"] = {}
        if not isinstance(parameters, dict):
            return json.dumps(request).encode(), None
        for name, value in parameters.items():
            if isinstance(value, (dict, list)) and name not in inputs:
                parameters[name] = json.dumps(value)
        key = parameters[CANCEL_KEY] = uuid.uuid4().hex
        return json.dumps(request).encode(), key

    def abort_later(self, model: str, key: str) -> None:
        """The client went away: abort its request at the llm, in the background."""
        task = asyncio.get_running_loop().create_task(self._abort(model, key))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    def _llms_of(self, model: str) -> asyncio.Task:
        """The llms behind `model`: a lookup started at most once per CACHE_S, shared by every request."""
        now = time.monotonic()
        cached = self._llm_lookups.get(model)
        if cached is None or now - cached[0] >= CACHE_S:
            cached = (now, asyncio.get_running_loop().create_task(self._llms_behind(model, depth=3)))
            _put(self._llm_lookups, model, cached)
        return cached[1]

    async def _abort(self, model: str, key: str) -> None:
        for target in await asyncio.shield(self._llms_of(model)):
            try:
                async with self.session.post(f"http://{self.address}/v2/models/{target}/generate",
                                             json={"parameters": {ABORT_KEY: key}}) as response:
                    await response.read()
            except aiohttp.ClientError:
                pass  # Triton is going away: nothing left to abort

    async def _llms_behind(self, model: str, depth: int) -> list[str]:
        config = await self._json(f"/v2/models/{model}/config")
        if not config or depth == 0:
            return []
        if config.get("backend") == "triton_llm":
            return [model]
        named = [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])]
        llm = config.get("parameters", {}).get("llm_model", {}).get("string_value")
        found = []
        for name in named + ([llm] if llm else []):
            found += await self._llms_behind(name, depth - 1)
        return list(dict.fromkeys(found))

    async def _json(self, path: str) -> dict | None:
        now = time.monotonic()
        cached = self._cache.get(path)
        if cached and now - cached[0] < CACHE_S:
            return cached[1]
        try:
            async with self.session.get(f"http://{self.address}{path}") as response:
                value = await response.json(content_type=None) if response.status == 200 else None
        except (aiohttp.ClientError, ValueError):
            value = None
        _put(self._cache, path, (now, value))
        return value


def _put(cache: dict, key: str, entry: tuple) -> None:
    """Newest last; past MAX_CACHED entries the oldest goes."""
    cache.pop(key, None)
    cache[key] = entry
    if len(cache) > MAX_CACHED:
        del cache[next(iter(cache))]


def _typed(key: str, value, datatype: str):
    """`value` for an input of `datatype`, converted from a string where it holds one."""
    if isinstance(value, list):
        return [_typed(key, v, datatype) for v in value]
    if datatype == "BOOL":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif datatype in _INTEGER_RANGES:
        number = _integer(value)
        bits = _INTEGER_RANGES[datatype]
        low, high = (0, 2**bits - 1) if datatype.startswith("U") else (-2**(bits - 1), 2**(bits - 1) - 1)
        if number is not None and low <= number <= high:
            return number
        if number is not None:
            raise GatewayError(400, f"'{key}' = {number} is out of range for {datatype} ({low} to {high})")
    elif datatype.startswith("FP") or datatype == "BF16":
        number = _float(value)
        if number is not None:
            return number
    elif datatype == "BYTES":
        if isinstance(value, str):
            return value
    else:
        return value
    raise GatewayError(400, f"'{key}' must be {_KINDS.get(datatype[:2], datatype)} for the input's type "
                            f"{datatype}, got {json.dumps(value)[:60]}")


_KINDS = {"BO": "true or false", "IN": "an integer", "UI": "an integer", "FP": "a number", "BF": "a number",
          "BY": "a string"}


def _integer(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _float(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
