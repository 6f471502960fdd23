"""Synchronous gRPC and HTTP transports of the client API: inference, streaming, repository calls.

Both return outputs as {name: value}: numpy arrays from tensors (gRPC, HTTP infer), JSON values
from the HTTP generate endpoints; `client.text_of` reads either. Every failure is a RagstackError
carrying Triton's status code (ragstack.error_codes, also where Triton drops it); a request that no
server answered is UNAVAILABLE, with the likely cause (ragstack.reachability). With TLS options
(ragstack.tls) both connect with TLS.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import queue
from typing import Iterator
from urllib.parse import urlsplit

import numpy as np

from ragstack.client import DEFAULT_PORTS
from ragstack.error_codes import code_from_grpc, code_from_http, code_from_message
from ragstack.reachability import address, explain
from ragstack.results import ModelInfo, RagstackError
from ragstack.tls import TLS_SCHEMES, TlsOptions

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


def split_url(url: str, protocol: str) -> tuple[str, int]:
    """The host and port of `url`: host:port, also written http://host:port or grpc://host:port (https://
    and grpcs:// ask for TLS, ragstack.tls, and default to port 443)."""
    parts = urlsplit(url if "://" in url else f"//{url}")
    if parts.scheme not in ("", "http", "grpc", *TLS_SCHEMES) or parts.path not in ("", "/"):
        raise ValueError(f"{url}: give the server as host:port, e.g. localhost:{DEFAULT_PORTS[protocol]}")
    try:
        return parts.hostname or "localhost", parts.port or (443 if parts.scheme in TLS_SCHEMES else
                                                             DEFAULT_PORTS[protocol])
    except ValueError:  # a port that is not a number
        raise ValueError(f"{url}: the port is not a number; give host:port") from None


def unanswered(protocol: str, host: str, port: int, message: str, tls: TlsOptions | None = None) -> RagstackError:
    """A request to host:port that may have had no server to answer it: the likely cause, or `message`
    where the port does speak `protocol` (with TLS under `tls`, or without)."""
    return RagstackError(explain(protocol, host, port, tls=tls) or message, "UNAVAILABLE")


def grpc_error(message: str, status: str | None, host: str, port: int, tls: TlsOptions | None = None) -> RagstackError:
    """A gRPC failure. Without a status it is an error inside a stream (Triton sends only the message);
    UNAVAILABLE is also what gRPC says when no server answered, which the probe tells apart."""
    if status is None:
        return RagstackError(message, code_from_message(message) or "UNKNOWN")
    code = code_from_grpc(status)
    return unanswered("grpc", host, port, message, tls) if code == "UNAVAILABLE" else RagstackError(message, code)


def generate_error(message: str, status: int | None) -> RagstackError:
    """An error of the generate endpoints: a decoupled model's answers 400 whatever its code, and an
    SSE error event (status None) has none."""
    return RagstackError(message, code_from_message(message) or code_from_http(status))


def model_infos(index) -> list[ModelInfo]:
    return [ModelInfo(m["name"], str(m.get("version", "")), m.get("state", "UNAVAILABLE"), m.get("reason", ""))
            for m in index]


class GrpcTransport:
    protocol = "grpc"

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str], tls: TlsOptions | None = None):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.grpc as grpcclient  # noqa: PLC0415 - keep `ragstack --help` fast

        self._module = grpcclient
        self.host, self.port = split_url(url, "grpc")
        self.url, self.timeout_s, self.headers, self.tls = address(self.host, self.port), timeout_s, headers, tls
        self._tls_arguments = tls.grpc_arguments() if tls else {}
        self._client = grpcclient.InferenceServerClient(self.url, **self._tls_arguments)

    def _error(self, exc) -> RagstackError:
        return grpc_error(exc.message(), exc.status(), self.host, self.port, self.tls)

    def _call(self, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise self._error(exc) from None

    def infer(self, model: str, tensors: dict[str, np.ndarray], version: str = "") -> dict[str, np.ndarray]:
        result = self._call(self._client.infer, model, infer_inputs(self._module, tensors),
                            model_version=version, client_timeout=self.timeout_s)
        return {out.name: result.as_numpy(out.name) for out in result.get_response().outputs}

    def stream(self, model: str, tensors: dict[str, np.ndarray], stream: bool,
               parameters: dict | None = None) -> Iterator[dict]:
        """Responses of one request on a gRPC stream (decoupled models); an abandoned iteration
        cancels the request on the server. `stream` matters to HTTP only (which endpoint): over gRPC
        the model's `stream` input decides how many responses come."""
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        client = self._module.InferenceServerClient(self.url, **self._tls_arguments)  # one stream per client object
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        finished = False
        try:
            try:
                client.async_stream_infer(model, infer_inputs(self._module, tensors), parameters=parameters,
                                          enable_empty_final_response=True)
            except InferenceServerException as exc:  # the stream failed before the request went out:
                finished = True                       # its callback has the cause
                with contextlib.suppress(queue.Empty):
                    exc = responses.get(timeout=5)[1] or exc
                raise self._error(exc) from None
            while not finished:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise RagstackError(f"{model}: no response within {self.timeout_s:.0f} s", "UNAVAILABLE") from None
                if error is not None:
                    finished = True  # an error is the request's last response
                    raise self._error(error)
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

    def __init__(self, url: str, timeout_s: float, headers: dict[str, str], tls: TlsOptions | None = None):
        # `headers` go with repository calls only (the admin key guards the repository API)
        import tritonclient.http as httpclient  # noqa: PLC0415

        self._module = httpclient
        self.host, self.port = split_url(url, "http")
        self.timeout_s, self.headers, self.tls = timeout_s, headers, tls
        self._client = httpclient.InferenceServerClient(address(self.host, self.port), connection_timeout=timeout_s,
                                                        network_timeout=timeout_s, **http_tls_arguments(tls))

    def _call(self, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise RagstackError(exc.message(), code_from_http(exc.status())) from None
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, not HTTP: no answer
            raise self._unanswered(exc) from None

    def _unanswered(self, exc: Exception) -> RagstackError:
        return unanswered("http", self.host, self.port, f"HTTP {address(self.host, self.port)}: {exc}", self.tls)

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
        conn = (http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self.tls.context())
                if self.tls else http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s))
        try:
            try:
                conn.request("POST", f"/v2/models/{model}/{endpoint}", body=json.dumps(body),
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._unanswered(exc) from None
            if response.status != 200:
                raise generate_error(error_text(response.read()), response.status)
            if not stream:
                yield json.loads(response.read())
                return
            for line in _lines(response, self.host, self.port):
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[5:])
                if "error" in event:
                    raise generate_error(str(event["error"]), None)
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


def http_tls_arguments(tls: TlsOptions | None) -> dict:
    """tritonclient.http's InferenceServerClient keywords for `tls`: geventhttpclient's context is
    built by ours (its own `insecure` still checks the certificate, only not the host name)."""
    if tls is None:
        return {}
    import gevent.ssl  # noqa: PLC0415 - tritonclient.http's own dependency

    return {"ssl": True, "insecure": tls.insecure, "ssl_context_factory": lambda **_: tls.context(gevent.ssl)}


def _lines(response: http.client.HTTPResponse, host: str, port: int) -> Iterator[bytes]:
    """The SSE stream's lines; a connection lost midway is UNAVAILABLE."""
    try:
        yield from response
    except (OSError, http.client.HTTPException) as exc:
        raise RagstackError(f"HTTP {address(host, port)}: the stream broke off: {exc}", "UNAVAILABLE") from None


def error_text(raw: bytes) -> str:
    """The message of an error body: JSON {"error": ...}, also as an SSE event (generate_stream)."""
    text = raw.decode(errors="replace").strip()
    body = text[len("data:"):] if text.startswith("data:") else text
    try:
        return str(json.loads(body).get("error", text))
    except (ValueError, AttributeError):
        return text
