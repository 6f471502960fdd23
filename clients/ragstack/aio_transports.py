"""asyncio gRPC (tritonclient.grpc.aio) and HTTP (tritonclient.http.aio, aiohttp for SSE)
transports; the same methods as ragstack.transports, as coroutines and async iterators, with the same
errors (the probe of a port that did not answer runs in a thread)."""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

import numpy as np

from ragstack.error_codes import code_from_http
from ragstack.reachability import address
from ragstack.results import ModelInfo, RagstackError
from ragstack.tls import TlsOptions
from ragstack.transports import (error_text, generate_error, grpc_error, infer_inputs, json_inputs, model_infos,
                                 split_url, unanswered)


class AsyncGrpcTransport:
    protocol = "grpc"

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str], tls: TlsOptions | None = None):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.grpc as grpcclient  # noqa: PLC0415
        import tritonclient.grpc.aio as grpcaio  # noqa: PLC0415

        self._module = grpcclient
        self.host, self.port = split_url(url, "grpc")
        self.timeout_s, self.headers, self.tls = timeout_s, headers, tls
        self._client = grpcaio.InferenceServerClient(address(self.host, self.port),
                                                     **(tls.grpc_arguments() if tls else {}))

    async def _error(self, message: str, status: str | None) -> RagstackError:
        return await asyncio.to_thread(grpc_error, message, status, self.host, self.port, self.tls)

    async def _call(self, coro):
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return await coro
        except InferenceServerException as exc:
            raise await self._error(exc.message(), exc.status()) from None

    async def infer(self, model: str, tensors: dict[str, np.ndarray], version: str = "") -> dict[str, np.ndarray]:
        result = await self._call(self._client.infer(model, infer_inputs(self._module, tensors),
                                                     model_version=version, client_timeout=self.timeout_s))
        return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}

    async def stream(self, model: str, tensors: dict[str, np.ndarray], stream: bool,
                     parameters: dict | None = None) -> AsyncIterator[dict]:
        """One request on a gRPC stream. The request iterator ends after the request, so the server
        closes the stream after the request's last response; an abandoned iteration cancels it."""
        import grpc  # noqa: PLC0415

        async def one_request():
            yield {"model_name": model, "inputs": infer_inputs(self._module, tensors), "parameters": parameters}

        responses = self._client.stream_infer(one_request(), stream_timeout=self.timeout_s)
        finished = False
        try:
            try:
                async for result, error in responses:
                    if error is not None:
                        raise await self._error(error.message(), error.status())
                    outputs = {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}
                    if outputs:
                        yield outputs
            except grpc.RpcError as exc:  # the stream itself failed (tritonclient passes it on as it is)
                raise await self._error(exc.details(), str(exc.code())) from None
            finished = True
        finally:
            if not finished:
                responses.cancel()

    async def models(self) -> list[ModelInfo]:
        index = await self._call(self._client.get_model_repository_index(headers=self.headers, as_json=True))
        return model_infos(index.get("models", []))

    async def model_config(self, name: str) -> dict:
        return (await self._call(self._client.get_model_config(name, headers=self.headers, as_json=True)))["config"]

    async def load(self, name: str, config: str | None = None) -> None:
        await self._call(self._client.load_model(name, headers=self.headers, config=config))

    async def unload(self, name: str) -> None:
        await self._call(self._client.unload_model(name, headers=self.headers))

    async def close(self) -> None:
        await self._client.close()


class AsyncHttpTransport:
    protocol = "http"

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str], tls: TlsOptions | None = None):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.http as httpclient  # noqa: PLC0415
        import tritonclient.http.aio as httpaio  # noqa: PLC0415

        self._module = httpclient
        self.host, self.port = split_url(url, "http")
        self.timeout_s, self.headers, self.tls = timeout_s, headers, tls
        self._ssl = tls.context() if tls else True   # aiohttp's ssl=: True is its default
        self._client = httpaio.InferenceServerClient(address(self.host, self.port), conn_timeout=timeout_s,
                                                     **({"ssl": True, "ssl_context": self._ssl} if tls else {}))
        self._session = None

    async def _unanswered(self, exc: Exception) -> RagstackError:
        return await asyncio.to_thread(unanswered, "http", self.host, self.port,
                                       f"HTTP {address(self.host, self.port)}: {exc}", self.tls)

    async def _call(self, coro):
        import aiohttp  # noqa: PLC0415
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return await coro
        except InferenceServerException as exc:
            raise RagstackError(exc.message(), code_from_http(exc.status())) from None
        except (OSError, aiohttp.ClientError) as exc:  # refused, reset, not HTTP: no answer
            raise await self._unanswered(exc) from None

    async def infer(self, model: str, tensors: dict[str, np.ndarray], version: str = "") -> dict[str, np.ndarray]:
        result = await self._call(self._client.infer(model, infer_inputs(self._module, tensors),
                                                     model_version=version))
        return {out["name"]: result.as_numpy(out["name"]) for out in result.get_response()["outputs"]}

    async def stream(self, model: str, tensors: dict[str, np.ndarray], stream: bool,
                     parameters: dict | None = None) -> AsyncIterator[dict]:
        import aiohttp  # noqa: PLC0415

        body = json_inputs(tensors)
        if parameters:
            body["parameters"] = parameters
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s))
        endpoint = "generate_stream" if stream else "generate"
        url = f"{'https' if self.tls else 'http'}://{address(self.host, self.port)}/v2/models/{model}/{endpoint}"
        try:
            async with self._session.post(url, json=body, ssl=self._ssl) as response:
                if response.status != 200:
                    raise generate_error(error_text(await response.read()), response.status)
                if not stream:
                    yield json.loads(await response.read())
                    return
                async for line in response.content:
                    if not line.startswith(b"data:"):
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise generate_error(str(event["error"]), None)
                    yield event
        except (OSError, aiohttp.ClientError) as exc:
            raise await self._unanswered(exc) from None

    async def models(self) -> list[ModelInfo]:
        return model_infos(await self._call(self._client.get_model_repository_index(headers=dict(self.headers))))

    async def model_config(self, name: str) -> dict:
        return await self._call(self._client.get_model_config(name, headers=dict(self.headers)))

    async def load(self, name: str, config: str | None = None) -> None:
        await self._call(self._client.load_model(name, headers=dict(self.headers), config=config))

    async def unload(self, name: str) -> None:
        await self._call(self._client.unload_model(name, headers=dict(self.headers)))

    async def close(self) -> None:
        await self._client.close()
        if self._session is not None:
            await self._session.close()
