"""The OpenAI-compatible API (FastAPI): its routes, every error in OpenAI's shape, the guard (API key,
requests in flight) and the metrics around them. Triton is reached over gRPC from the app's lifespan."""
from __future__ import annotations

import contextlib
import importlib.metadata
import sys

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ragstack import admin_key
from ragstack.openai_frontend import inflight, keys, metrics, models
from ragstack.openai_frontend.chat import chat_completions
from ragstack.openai_frontend.completions import completions
from ragstack.openai_frontend.disconnect import CLIENT_GONE, ClientGone
from ragstack.openai_frontend.embeddings import embeddings
from ragstack.openai_frontend.errors import APIError, model_not_found
from ragstack.openai_frontend.frontend import Frontend
from ragstack.openai_frontend.guard import Guard
from ragstack.openai_frontend.internal_errors import InternalErrors
from ragstack.openai_frontend.limits import FrontendLimits
from ragstack.openai_frontend.request_id import RequestId
from ragstack.openai_frontend.rerank import rerank, rerank_v2
from ragstack.openai_frontend.score import score
from ragstack.openai_frontend.tokenization import detokenize, tokenize
from ragstack.openai_frontend.triton import Triton


def create_app(triton_address: str, limits: FrontendLimits, api_key: str | None, key: str | None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.frontend = Frontend(Triton(triton_address, key), limits, api_key, key)
        print(f"[openai] serving the OpenAI API, Triton at gRPC {triton_address}"
              f"{'; API key required' if api_key else '; no API key: the API is open'}", file=sys.stderr, flush=True)
        yield
        await app.state.frontend.triton.close()

    # no redirect to a path without its trailing slash: its Location, built from Host, loses a proxy's prefix
    app = FastAPI(title="ragstack OpenAI-compatible API", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None, redirect_slashes=False)
    app.add_middleware(InternalErrors)   # innermost: the guard and the metrics see its 500s
    app.add_middleware(Guard, inflight=inflight.from_environment(limits.max_inflight), api_key=api_key)
    app.add_middleware(metrics.Metrics)   # it sees the guard's refusals too
    if limits.origins():   # a browser's preflight carries no key, and every answer needs the headers
        app.add_middleware(CORSMiddleware, allow_origins=limits.origins(), allow_methods=["*"], allow_headers=["*"],
                           expose_headers=["x-request-id"])
    app.add_middleware(RequestId)   # outermost: on every answer, a preflight's too
    app.add_exception_handler(APIError, lambda _request, exc: exc.response())
    for gone in (ClientGone, ClientDisconnect):   # before its answer; or while it sent its body
        app.add_exception_handler(gone, lambda _request, _exc: Response(status_code=CLIENT_GONE))
    app.add_exception_handler(HTTPException, _http_error)

    def route(path: str, handler, methods=("POST",)) -> None:
        async def endpoint(request: Request) -> Response:
            return await handler(request, request.app.state.frontend)
        # HEAD wherever GET (uptime checks and probes send it; uvicorn sends no body)
        app.add_api_route(path, endpoint, methods=[*methods, *(["HEAD"] if "GET" in methods else [])],
                          include_in_schema=False)

    for path in ("/v1/rerank", "/rerank"):
        route(path, rerank)
    route("/v2/rerank", rerank_v2)   # Cohere v2's
    for path in ("/score", "/v1/score"):   # vLLM's paths, /score first
        route(path, score)
    route("/v1/chat/completions", chat_completions)
    route("/v1/completions", completions)
    route("/v1/embeddings", embeddings)
    for path in ("/tokenize", "/v1/tokenize"):   # vLLM's paths are the first
        route(path, tokenize)
    for path in ("/detokenize", "/v1/detokenize"):
        route(path, detokenize)
    route("/v1/models", list_models, ("GET",))
    route("/v1/models/{model_id}", get_model, ("GET",))
    route("/v1/models/{model_id}/load", load_model)
    route("/v1/models/{model_id}/unload", unload_model)
    route("/health", health, ("GET",))
    route("/ping", health, ("GET", "POST"))   # vLLM's (SageMaker's health check)
    route("/version", version, ("GET",))
    app.add_api_route("/metrics", metrics.exposition, methods=["GET", "HEAD"], include_in_schema=False)
    return app


async def list_models(_request: Request, frontend: Frontend) -> JSONResponse:
    return JSONResponse({"object": "list", "data": await models.listing(frontend.triton)})


async def get_model(request: Request, frontend: Frontend) -> JSONResponse:
    name = models.checked_name(request.path_params["model_id"])
    config = await frontend.triton.config(name)
    if config is None or models.kind_of(config) is None:
        raise model_not_found(name)
    metrics.served_model(request, name)
    return JSONResponse(await models.described(frontend.triton, name, config))


async def load_model(request: Request, frontend: Frontend) -> JSONResponse:
    name = await _in_repository(request, frontend)
    await frontend.triton.load(name)
    return JSONResponse({**models.model_object(name), "loaded": True})


async def unload_model(request: Request, frontend: Frontend) -> JSONResponse:
    name = await _in_repository(request, frontend)
    await frontend.triton.unload(name)
    return JSONResponse({**models.model_object(name), "loaded": False})


async def _in_repository(request: Request, frontend: Frontend) -> str:
    """The model named by the path, for an admin, if the repositories hold it (loaded or not)."""
    keys.check_admin(request.headers.get(admin_key.HEADER, ""), frontend.admin_key)
    name = models.checked_name(request.path_params["model_id"])
    if name not in {m["name"] for m in await frontend.triton.index()}:
        raise APIError(404, f"no model '{name[:200]}' in the model repositories", "model", "model_not_found")
    return name


async def health(_request: Request, frontend: Frontend) -> JSONResponse:
    """Ready when Triton is, or when Triton is live and a model the API serves is ready: Triton's strict
    readiness stays false after any model's failed load (2.51: until that model loads), while the API's models
    go on answering, and a probe must not take those out of service."""
    if await frontend.triton.ready():
        return JSONResponse({"status": "ok"})
    if await frontend.triton.live() and await models.listing(frontend.triton):
        return JSONResponse({"status": "ok", "triton": "not ready: a model is loading, unloading or failed to load"})
    return APIError(503, f"tritonserver at {frontend.triton.address} is not ready", code="unavailable").response()


async def version(_request: Request, _frontend: Frontend) -> JSONResponse:
    return JSONResponse({"version": importlib.metadata.version("ragstack")})


def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own answers (no such route, a method the route does not take) in OpenAI's shape, with their
    headers (a 405's Allow, which RFC 9110 requires)."""
    message = {404: f"no route {request.url.path}",
               405: f"{request.url.path} does not take {request.method}"}.get(exc.status_code, str(exc.detail))
    response = APIError(exc.status_code, message[:300], code="not_found" if exc.status_code == 404 else None).response()
    response.headers.update(exc.headers or {})
    return response

