"""A request's body, bounded before it is parsed: its media type (application/json), its size
(max_body_bytes, counted as it arrives), its pauses (body_timeout_s) and its whole time (MIN_BODY_RATE), its
JSON nesting (max_json_depth, counted without parsing: Python's parser recurses), then its JSON (strict: UTF-8,
no NaN, Infinity or number past a double's range, no string holding a lone surrogate, which no text encoding
can carry on) and its fields (a pydantic model). Every refusal names the limit or the field."""
from __future__ import annotations

import asyncio
import json
import math
import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from ragstack.gateway import json_depth
from ragstack.openai_frontend.errors import APIError
from ragstack.openai_frontend.limits import FrontendLimits

M = TypeVar("M", bound=BaseModel)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_CONTAINERS = (str, dict, list)
# A body sent a byte at a time, each within body_timeout_s, would hold a place of max_inflight for as long as it
# lasts: a whole body gets body_timeout_s plus a second per MIN_BODY_RATE bytes of its size (or of max_body_bytes).
MIN_BODY_RATE = 64 << 10


async def read(request: Request, limits: FrontendLimits) -> bytes:
    cap = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {cap} (max_body_bytes)",
                       code="request_too_large")
    chunks, size = [], 0
    stream = request.stream()
    loop = asyncio.get_running_loop()
    allowed = limits.body_timeout_s + (int(declared) if declared.isdigit() else cap) / MIN_BODY_RATE
    deadline = loop.time() + allowed
    while True:
        wait = min(limits.body_timeout_s, deadline - loop.time())
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), wait)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            if wait < limits.body_timeout_s:
                raise APIError(408, f"the request body took more than {allowed:.0f} s (body_timeout_s, plus 1 s "
                                    f"per {MIN_BODY_RATE >> 10} KiB it declares)", code="timeout") from None
            raise APIError(408, f"no request body data for {limits.body_timeout_s:g} s (body_timeout_s)",
                           code="timeout") from None
        size += len(chunk)
        if size > cap:
            raise APIError(413, f"the request body is more than {cap} bytes (max_body_bytes)",
                           code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse(request: Request, model: type[M], limits: FrontendLimits) -> M:
    # vLLM's rule, and what keeps other web pages out: a browser sends text/plain, a form or no type at all to
    # any origin without asking first (no CORS preflight), application/json only after one.
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise APIError(415, f"the request body must be sent as Content-Type application/json, got "
                            f"{media_type[:80] or 'none'}", code="unsupported_media_type")
    body = await read(request, limits)
    found = json_depth.deeper_than(body, limits.max_json_depth)
    if found is not None:
        raise APIError(400, f"the request's JSON nests {found} levels deep; the limit is {limits.max_json_depth} "
                            "(max_json_depth)")
    encoding = json.detect_encoding(body)
    if encoding not in ("utf-8", "utf-8-sig"):   # RFC 8259: JSON between systems is UTF-8
        raise APIError(400, f"the request body must be JSON in UTF-8, got {encoding}")
    try:   # decoded here, strictly: json.loads would let UTF-8-encoded surrogates (ED A0 80 ...) through
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not UTF-8: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:
        raise APIError(400, f"the request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(value).__name__}")
    if _SURROGATE_ESCAPE.search(body):   # the only way to a surrogate: strict UTF-8 cannot encode one
        refuse_surrogates(value)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = _param(error["loc"])
        given = json.dumps(error.get("input"), default=str)
        given = given if len(given) <= 60 else given[:57] + "..."
        detail = f"{error['msg']}, got {given}" if error["type"] != "missing" else error["msg"]
        raise APIError(400, f"{param}: {detail}" if param else detail, param or None) from None


def _not_json(literal: str):
    raise ValueError(f"{literal} is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal[:40]} is past a double's range")
    return value


def refuse_surrogates(value, param: str = "") -> None:
    """A `\\ud800` escape is JSON, but the string it makes is not Unicode text: refused here, naming where
    (`param`, the field `value` is)."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise APIError(400, f"{param or 'the request body'} holds a lone surrogate escape (\\ud800-\\udfff), "
                                "which is not text", param or None)
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_surrogates(key, param)
            if type(item) in _CONTAINERS:   # scalars tested here: a token-id prompt holds 100,000s of them
                refuse_surrogates(item, f"{param}.{key}" if param else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if type(item) in _CONTAINERS:
                refuse_surrogates(item, f"{param}[{i}]")


def refuse_deeper(text: bytes, param: str, max_depth: int) -> None:
    """A 400 naming `param` when the JSON `text` nests more than max_depth levels of lists and objects."""
    found = json_depth.deeper_than(text, max_depth)
    if found is not None:
        raise APIError(400, f"{param} nests {found} levels deep; the limit there is {max_depth}", param)


def json_text(text: str, param: str, max_depth: int):
    """JSON text inside the body's JSON (a tool call's arguments), parsed as strictly as the body: at most
    max_depth levels of lists and objects, no NaN, Infinity or lone surrogate; else a 400 naming `param`."""
    refuse_deeper(text.encode("utf-8", "surrogatepass"), param, max_depth)
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:
        raise APIError(400, f"{param} is not valid JSON: {exc}", param) from None
    refuse_surrogates(value, param)
    return value


def _param(loc: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content"; the branches of a union (type names such as
    "str", "list[str]", "Document") left out."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not (part in ("str", "int", "float", "bool") or "[" in part or part[:1].isupper()):
            text += f".{part}" if text else part
    return text
