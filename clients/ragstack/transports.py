"""Synchronous gRPC and HTTP transports of the client API: inference, streaming, repository calls.

Both return outputs as {name: value}: numpy arrays from tensors (gRPC, HTTP infer), JSON values
from the HTTP generate endpoints; `client.text_of` reads either. Every failure is a RagstackError
carrying Triton's status code.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import queue
from typing import Iterator
from urllib.parse import urlsplit

import numpy as np

from ragstack.results import ModelInfo, RagstackError, code_from_grpc, code_from_http

_DTYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
           np.dtype(np.bool_): "BOOL", np.dtype(object): "BYTES"}


def infer_inputs(module, tensors: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in tensors.items():
        tensor = module.InferInput(name, list(array.shape), _DTYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def json_inputs(tensors: dict[str, np.ndarray]) -> dict:
    """Single-element tensors as the generate endpoints take them: plain JSON values."""
    body = {}
    for name, array in tensors.items():
        if array.size != 1:
            raise ValueError(f"{name}: the generate endpoint takes single values, got shape {list(array.shape)}")
        value = array.reshape(-1)[0]
        body[name] = value.decode() if isinstance(value, bytes) else value.item()
    return body


def split_url(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"//{url}")
    return parts.hostname or "localhost", parts.port or default_port


def model_infos(index) -> list[ModelInfo]:
    return [ModelInfo(m["name"], str(m.get("version", "")), m.get("state", "UNAVAILABLE"), m.get("reason", ""))
            for m in index]


class GrpcTransport:
    protocol = "grpc"

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str]):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.grpc as grpcclient  # noqa: PLC0415 - keep `ragstack --help` fast

        self._module = grpcclient
        self.url, self.timeout_s, self.headers = url, timeout_s, headers
        self._client = grpcclient.InferenceServerClient(url)

    def _call(self, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise RagstackError(exc.message(), code_from_grpc(exc.status())) from None

    def infer(self, model: str, tensors: dict[str, np.ndarray], version: str = "") -> dict[str, np.ndarray]:
        result = self._call(self._client.infer, model, infer_inputs(self._module, tensors),
                            model_version=version, client_timeout=self.timeout_s)
        return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}

    def stream(self, model: str, tensors: dict[str, np.ndarray], stream: bool,
               parameters: dict | None = None) -> Iterator[dict]:
        """Responses of one request on a gRPC stream (decoupled models); an abandoned iteration
        cancels the request on the server. `stream` matters to HTTP only (which endpoint): over gRPC
        the model's `stream` input decides how many responses come."""
        client = self._module.InferenceServerClient(self.url)  # one stream per client object
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        finished = False
        try:
            self._call(client.async_stream_infer, model, infer_inputs(self._module, tensors),
                       parameters=parameters, enable_empty_final_response=True)
            while not finished:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise RagstackError(f"{model}: no response within {self.timeout_s:.0f} s", "UNAVAILABLE") from None
                if error is not None:
                    finished = True  # an error is the request's last response
                    raise RagstackError(error.message(), code_from_grpc(error.status()))
                response = result.get_response()
                finished = response.parameters["triton_final_response"].bool_param
                outputs = {out.name: result.as_numpy(out.name) for out in response.outputs}
                if outputs:
                    yield outputs
        finally:
            client.stop_stream(cancel_requests=not finished)
            client.close()

    def models(self) -> list[ModelInfo]:
        return model_infos(self._call(self._client.get_model_repository_index, headers=self.headers,
                                  as_json=True).get("models", []))

    def model_config(self, name: str) -> dict:
        return self._call(self._client.get_model_config, name, headers=self.headers, as_json=True)["config"]

    def load(self, name: str, config: str | None = None) -> None:
        self._call(self._client.load_model, name, headers=self.headers, config=config)

    def unload(self, name: str) -> None:
        self._call(self._client.unload_model, name, headers=self.headers)

    def close(self) -> None:
        self._client.close()


class HttpTransport:
    protocol = "http"

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str]):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.http as httpclient  # noqa: PLC0415

        self._module = httpclient
        self.host, self.port = split_url(url, 8000)
        self.timeout_s, self.headers = timeout_s, headers
        self._client = httpclient.InferenceServerClient(f"{self.host}:{self.port}", connection_timeout=timeout_s,
                                                        network_timeout=timeout_s)

    def _call(self, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise RagstackError(exc.message(), code_from_http(exc.status())) from None
        except OSError as exc:  # refused, reset, timed out: the server is not there
            raise RagstackError(f"HTTP {self.host}:{self.port}: {exc}", "UNAVAILABLE") from None

    def infer(self, model: str, tensors: dict[str, np.ndarray], version: str = "") -> dict[str, np.ndarray]:
        result = self._call(self._client.infer, model, infer_inputs(self._module, tensors),
                            model_version=version)
        return {out["name"]: result.as_numpy(out["name"]) for out in result.get_response()["outputs"]}

    def stream(self, model: str, tensors: dict[str, np.ndarray], stream: bool,
               parameters: dict | None = None) -> Iterator[dict]:
        """POST /generate (one response) or /generate_stream (SSE). An error can arrive as an SSE
        event after the 200, so every event is checked; closing the connection early makes the
        server cancel the request."""
        body = json_inputs(tensors)
        if parameters:
            body["parameters"] = parameters
        endpoint = "generate_stream" if stream else "generate"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            try:
                conn.request("POST", f"/v2/models/{model}/{endpoint}", body=json.dumps(body),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
            except OSError as exc:
                raise RagstackError(f"HTTP {self.host}:{self.port}: {exc}", "UNAVAILABLE") from None
            if response.status != 200:
                raise RagstackError(error_text(response.read()), code_from_http(response.status))
            if not stream:
                yield json.loads(response.read())
                return
            for line in response:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise RagstackError(str(event["error"]), "UNKNOWN")  # SSE errors carry no status
                yield event
        finally:
            conn.close()

    def models(self) -> list[ModelInfo]:
        return model_infos(self._call(self._client.get_model_repository_index, headers=dict(self.headers)))

    def model_config(self, name: str) -> dict:
        return self._call(self._client.get_model_config, name, headers=dict(self.headers))

    def load(self, name: str, config: str | None = None) -> None:
        self._call(self._client.load_model, name, headers=dict(self.headers), config=config)

    def unload(self, name: str) -> None:
        self._call(self._client.unload_model, name, headers=dict(self.headers))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()


def error_text(raw: bytes) -> str:
    """The message of an error body: JSON {"error": ...}, also as an SSE event (generate_stream)."""
    text = raw.decode(errors="replace").strip()
    body = text[len("data:"):] if text.startswith("data:") else text
    try:
        return str(json.loads(body).get("error", text))
    except (ValueError, AttributeError):
        return text
