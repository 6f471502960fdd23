"""Triton over gRPC, as the frontend needs it: one request on a stream of its own (decoupled models; the
messages written and read by triton_wire.py), and through tritonclient.grpc.aio unary inference, model
configs (cached, and fetched again in the background while requests ask for them), the repository index,
load and unload.

One channel serves every stream, another (tritonclient's) the rest. A stream whose consumer stops early
is cancelled, which makes Triton cancel the request (the llm frees its KV blocks). Every failure is an
APIError. An address `dns:///HOST:PORT` (on Kubernetes, a headless Service: one address per Triton pod)
spreads requests over every address the name resolves to (round_robin), where HOST:PORT keeps one
connection to one server.
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ragstack import admin_key
from ragstack.openai_frontend import triton_wire
from ragstack.openai_frontend.errors import APIError, from_triton, not_ready, unreachable

CONFIG_CACHE_S = 5.0   # an unloaded model is seen within this (a loaded one at once: models.served)
# The configs of models served in the last KEEP_FRESH_S are fetched again every REFRESH_S in the background:
# a fetch is a round trip (~2 ms here) that a request would otherwise wait for, once its worker had been
# idle for CONFIG_CACHE_S (at one stream over 4 workers, most requests).
REFRESH_S, KEEP_FRESH_S = CONFIG_CACHE_S / 2, 300.0
# The repository index, read for requests that find no model (names come from clients): at most this often,
# one read at a time, a refusal kept as long.
INDEX_CACHE_S = 0.25
CHANGING = ("LOADING", "UNLOADING")


def tensors_of(inputs: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), triton_wire.DATATYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


def texts(values: list[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def flag(value: bool) -> np.ndarray:
    return np.array([value], dtype=np.bool_)


def channel_args(address: str) -> list[tuple[str, object]]:
    """tritonclient's own channel options; for `dns:///HOST:PORT` with the round_robin policy too, so each
    new stream goes to the next Triton pod rather than all of them to the one pod a single connection
    reached. The name is resolved again when a pod's connection closes (a pod drained or replaced);
    docs/scaling.md says when new pods get traffic."""
    keepalive = grpcaio.KeepAliveOptions()
    options = [("grpc.max_send_message_length", grpcaio.MAX_GRPC_MESSAGE_SIZE),
               ("grpc.max_receive_message_length", grpcaio.MAX_GRPC_MESSAGE_SIZE),
               ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
               ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
               ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
               ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data)]
    return options + [("grpc.lb_policy_name", "round_robin")] if address.startswith("dns:") else options


class Triton:
    def __init__(self, address: str, key: str | None):
        self.address = address
        self._client = grpcaio.InferenceServerClient(address, channel_args=channel_args(address))
        self._streams = grpc.aio.insecure_channel(address, options=channel_args(address))
        self._stream_infer = service_pb2_grpc.GRPCInferenceServiceStub(self._streams).ModelStreamInfer
        self._admin = admin_key.headers("grpc", key)
        self._configs: dict[str, tuple[float, dict | None]] = {}
        self._served: dict[str, float] = {}  # model -> when a request last asked for its config, if it has one
        self._refresher: asyncio.Task | None = None
        self._index_read: tuple[float, asyncio.Task] | None = None

    async def stream(self, model: str, inputs: dict[str, np.ndarray], parameters: dict | None = None,
                     params: dict[str, str] | None = None) -> AsyncIterator[dict[str, np.ndarray]]:
        """Each response's outputs; ends after the request's last. `params` name the request fields
        behind the model's inputs in its error messages (errors.from_triton)."""
        call = self._stream_infer()
        finished = False
        try:
            try:
                await call.write(triton_wire.request(model, inputs, parameters))
                await call.done_writing()  # Triton still streams every response of the request
            except grpc.aio.AioRpcError as exc:
                raise unreachable(self.address, f"{exc.code().name}: {exc.details()}") from None
            except asyncio.InvalidStateError:  # the call ended before the request went out: read says why
                pass
            while True:
                try:
                    response = await call.read()
                except grpc.aio.AioRpcError as exc:  # no Triton to answer, or it went away
                    raise unreachable(self.address, f"{exc.code().name}: {exc.details()}") from None
                if response is grpc.aio.EOF:
                    break
                if response.error_message:
                    raise await self._ran(model, from_triton(response.error_message, None, params))
                try:
                    outputs = triton_wire.outputs(response.infer_response)
                except triton_wire.WireError as error:
                    raise APIError(500, f"tritonserver at {self.address} sent a response that does not read: "
                                        f"{error}") from None
                if outputs:
                    yield outputs
            finished = True
        finally:
            if not finished:  # given up (the client went away, an error): Triton cancels the request
                call.cancel()

    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    params: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        try:
            result = await self._client.infer(model, tensors_of(inputs))
        except InferenceServerException as exc:
            raise await self._ran(model, _failure(exc, params)) from None
        return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}

    async def config(self, model: str, fresh: bool = False) -> dict | None:
        """The model's config as JSON, None when it is not loaded (cached CONFIG_CACHE_S unless `fresh`;
        refreshed in the background while the model is asked for)."""
        now = time.monotonic()
        cached = self._configs.get(model)
        config = cached[1] if cached and not fresh and now - cached[0] < CONFIG_CACHE_S \
            else await self._fetch_config(model)
        if config is not None:
            self._served[model] = now
            if self._refresher is None or self._refresher.done():
                self._refresher = asyncio.get_running_loop().create_task(self._keep_fresh())
        return config

    async def _fetch_config(self, model: str) -> dict | None:
        now = time.monotonic()
        try:
            config = (await self._client.get_model_config(model, as_json=True))["config"]
        except InferenceServerException as exc:
            if exc.status() != "StatusCode.NOT_FOUND" and "Request for unknown model" not in exc.message():
                raise _failure(exc) from None
            config = None
        if len(self._configs) > 1024:  # names come from clients: keep the cache bounded
            self._configs.clear()
        self._configs[model] = (now, config)
        return config

    async def _keep_fresh(self) -> None:
        """Until no model has been asked for in KEEP_FRESH_S (the next request starts it again)."""
        while True:
            await asyncio.sleep(REFRESH_S)
            now = time.monotonic()
            self._served = {m: t for m, t in self._served.items() if now - t < KEEP_FRESH_S}
            if not self._served:
                return
            for model in list(self._served):
                try:
                    if await self._fetch_config(model) is None:
                        self._served.pop(model, None)  # unloaded: not served until asked for again
                except APIError:  # Triton away for now: requests fetch for themselves meanwhile
                    self._configs.pop(model, None)

    async def llms_behind(self, model: str, depth: int = 3) -> list[str]:
        """The llm models (backend triton_llm) that `model` runs: itself, its ensemble's steps, or the
        model its `llm_model` parameter names (rag_generate's)."""
        config = await self.config(model)
        if config is None or depth == 0:
            return []
        if config.get("backend") == "triton_llm":
            return [model]
        steps = [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])]
        named = config.get("parameters", {}).get("llm_model", {}).get("string_value")
        found = []
        for name in steps + ([named] if named else []):
            found += await self.llms_behind(name, depth - 1)
        return list(dict.fromkeys(found))

    async def index(self) -> list[dict]:
        """The repository index (names, versions, states); needs the admin key where one is set."""
        try:
            index = await self._client.get_model_repository_index(headers=self._admin, as_json=True)
        except InferenceServerException as exc:
            raise _failure(exc) from None
        return index.get("models", [])

    async def recent_index(self) -> list[dict] | None:
        """The repository index as read at most INDEX_CACHE_S ago, by one read that every caller shares; None
        where Triton refused it (an admin key it wants and this frontend lacks)."""
        now = time.monotonic()
        if self._index_read is None or now - self._index_read[0] > INDEX_CACHE_S:
            read = asyncio.get_running_loop().create_task(self.index())
            read.add_done_callback(lambda task: task.cancelled() or task.exception())   # a refusal: seen, kept
            self._index_read = (now, read)
        try:
            return await asyncio.shield(self._index_read[1])
        except APIError:
            return None

    async def changing(self) -> bool:
        """Whether Triton is loading or unloading a model now (recent_index; False where it refuses the index)."""
        return any(m.get("state") in CHANGING for m in await self.recent_index() or ())

    async def _ran(self, model: str, failure: APIError) -> APIError:
        """An inference's failure. Its model was found loaded before the call (models.served), so a model Triton
        does not know now is one it runs (rag's llm) or itself, unloaded since: 503 while one is loading or
        unloading, else 500 naming what is missing (a deployment's fault, not the request's)."""
        if failure.status != 404:
            return failure
        if await self.changing():
            return not_ready(f"model '{model}' cannot run now: {failure.message}; retry in a few seconds")
        return APIError(500, f"model '{model}' runs a model that is not loaded: {failure.message}")

    async def load(self, model: str) -> None:
        await self._repository(self._client.load_model(model, headers=self._admin), model, "load")

    async def unload(self, model: str) -> None:
        await self._repository(self._client.unload_model(model, headers=self._admin), model, "unload")

    async def _repository(self, call, model: str, action: str) -> None:
        try:
            await call
        except InferenceServerException as exc:
            failure = _failure(exc)
            if failure.status == 400:   # Triton's INVALID_ARG for a model that failed: the server's, not the call's
                failure = APIError(500, failure.message, "model", f"model_{action}_failed")
            raise failure from None
        finally:
            self._configs.pop(model, None)

    async def ready(self) -> bool:
        try:
            return await self._client.is_server_ready()
        except InferenceServerException:
            return False

    async def live(self) -> bool:
        try:
            return await self._client.is_server_live()
        except InferenceServerException:
            return False

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        await self._streams.close()
        await self._client.close()


def _failure(exc: InferenceServerException, params: dict[str, str] | None = None) -> APIError:
    return from_triton(exc.message() or "", exc.status(), params)
