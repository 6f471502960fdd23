"""Triton over gRPC (tritonclient.grpc.aio), as the frontend needs it: one request on a stream of its own
(decoupled models), unary inference, model configs (cached), the repository index, load and unload.

One channel serves every request. A stream whose consumer stops early is cancelled, which makes
Triton cancel the request (the llm frees its KV blocks). Every failure is an APIError. An address
`dns:///HOST:PORT` (on Kubernetes, a headless Service: one address per Triton pod) spreads requests over
every address the name resolves to (round_robin), where HOST:PORT keeps one connection to one server.
"""
from __future__ import annotations

import time
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from ragstack import admin_key
from ragstack.openai_frontend.errors import APIError, from_triton, unreachable

_DTYPES = {np.dtype(np.object_): "BYTES", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32"}
CONFIG_CACHE_S = 5.0   # a model loaded or unloaded is seen within this


def tensors_of(inputs: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), _DTYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


def texts(values: list[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def flag(value: bool) -> np.ndarray:
    return np.array([value], dtype=np.bool_)


def channel_args(address: str) -> list[tuple[str, object]] | None:
    """None (tritonclient's defaults) for HOST:PORT; for `dns:///HOST:PORT` the same options with the
    round_robin policy, so each new stream goes to the next Triton pod rather than all of them to the one
    pod a single connection reached. The name is resolved again when a pod's connection closes (a pod
    drained or replaced); docs/scaling.md says when new pods get traffic."""
    if not address.startswith("dns:"):
        return None
    keepalive = grpcaio.KeepAliveOptions()
    return [("grpc.max_send_message_length", grpcaio.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", grpcaio.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.lb_policy_name", "round_robin")]


class Triton:
    def __init__(self, address: str, key: str | None):
        self.address = address
        self._client = grpcaio.InferenceServerClient(address, channel_args=channel_args(address))
        self._admin = admin_key.headers("grpc", key)
        self._configs: dict[str, tuple[float, dict | None]] = {}

    async def stream(self, model: str, inputs: dict[str, np.ndarray], parameters: dict | None = None,
                     params: dict[str, str] | None = None) -> AsyncIterator[dict[str, np.ndarray]]:
        """Each response's outputs; ends after the request's last. `params` name the request fields
        behind the model's inputs in its error messages (errors.from_triton)."""
        async def one_request():
            yield {"model_name": model, "inputs": tensors_of(inputs), "parameters": parameters}

        responses = self._client.stream_infer(one_request())
        finished = False
        try:
            while True:
                try:
                    result, error = await responses.__anext__()
                except StopAsyncIteration:
                    break
                except grpc.aio.AioRpcError as exc:  # no Triton to answer, or it went away
                    raise unreachable(self.address, f"{exc.code().name}: {exc.details()}") from None
                if error is not None:
                    raise from_triton(error.message(), None, params)
                outputs = {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}
                if outputs:
                    yield outputs
            finished = True
        finally:
            if not finished:  # given up (the client went away, an error): Triton cancels the request
                responses.cancel()

    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    params: dict[str, str] | None = None) -> dict[str, np.ndarray]:
        try:
            result = await self._client.infer(model, tensors_of(inputs))
        except InferenceServerException as exc:
            raise _failure(exc, params) from None
        return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}

    async def config(self, model: str) -> dict | None:
        """The model's config as JSON, None when it is not loaded (cached CONFIG_CACHE_S)."""
        now = time.monotonic()
        cached = self._configs.get(model)
        if cached and now - cached[0] < CONFIG_CACHE_S:
            return cached[1]
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

    async def load(self, model: str) -> None:
        await self._repository(self._client.load_model(model, headers=self._admin), model)

    async def unload(self, model: str) -> None:
        await self._repository(self._client.unload_model(model, headers=self._admin), model)

    async def _repository(self, call, model: str) -> None:
        try:
            await call
        except InferenceServerException as exc:
            raise _failure(exc) from None
        self._configs.pop(model, None)

    async def ready(self) -> bool:
        try:
            return await self._client.is_server_ready()
        except InferenceServerException:
            return False

    async def close(self) -> None:
        await self._client.close()


def _failure(exc: InferenceServerException, params: dict[str, str] | None = None) -> APIError:
    return from_triton(exc.message() or "", exc.status(), params)
