"""The ragstack client API: RagClient (sync) and AsyncRagClient (asyncio), over gRPC or HTTP.

    with RagClient("localhost:8001") as client:             # protocol="http" for port 8000
        stream = client.query("How does Triton batch requests?")
        for delta in stream:                                  # text as the llm streams it
            print(delta, end="", flush=True)
        print(stream.answer.sources)                          # [Source(n=1, source=..., ...), ...]

Streaming goes through gRPC bidirectional streams, or HTTP `generate_stream` (SSE, every event
checked for an error). Failures raise RagstackError with Triton's status code (`.code`).
Repository calls (models, load, unload) send $RAGSTACK_ADMIN_KEY when it is set, in the header each
protocol needs (ragstack.admin_key): docker-compose, and `ragstack serve` with the variable set,
guard the repository API with it.
TLS (a server behind a TLS-terminating proxy): an https:// or grpcs:// URL, or `tls=` True or
TlsOptions(ca_file=..., cert_file=..., key_file=..., insecure=...) (ragstack.tls).
"""
from __future__ import annotations

import json
import os
from typing import AsyncIterator, Iterator

import numpy as np

from ragstack import admin_key
from ragstack.results import (Answer, Embeddings, ModelInfo, Passage, RagContext, RagstackError, RankedPassage,
                              parse_sources)
from ragstack.tls import TlsOptions, resolve as tls_options

EMBED, RERANK, RETRIEVER, RAG_CONTEXT, RAG, LLM = "embed", "rerank", "retriever", "rag_context", "rag", "llm"
DEFAULT_PORTS = {"grpc": 8001, "http": 8000}


def default_url(protocol: str) -> str:
    return os.environ.get("RAGSTACK_URL") or f"localhost:{DEFAULT_PORTS[protocol]}"


def text_of(value) -> str:
    """A BYTES output as text, from a numpy array (tensors) or a JSON value (generate endpoints)."""
    if isinstance(value, np.ndarray):
        return "".join(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                       for v in value.reshape(-1))
    if isinstance(value, list):
        return "".join(text_of(v) for v in value)
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _bytes(values: list[str]) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=object)


def _optional_int(tensors: dict, name: str, value: int | None) -> None:
    if value is not None:
        tensors[name] = np.array([value], dtype=np.int32)


def _query_tensors(text: str, top_k: int | None, top_n: int | None) -> dict[str, np.ndarray]:
    tensors = {"query": _bytes([text])}
    _optional_int(tensors, "top_k", top_k)
    _optional_int(tensors, "top_n", top_n)
    return tensors


def _context_tensors(text: str, top_k: int | None, top_n: int | None, max_tokens: int | None) -> dict:
    tensors = _query_tensors(text, top_k, top_n)
    _optional_int(tensors, "max_tokens", max_tokens)
    return tensors


def _rag_tensors(text: str, top_k: int | None, top_n: int | None, answer_format: str | None,
                 max_answer_chars: int | None) -> dict:
    tensors = _query_tensors(text, top_k, top_n)
    if answer_format is not None:
        tensors["answer_format"] = _bytes([answer_format])
    _optional_int(tensors, "max_answer_chars", max_answer_chars)
    return tensors


def _generation_tensors(tensors: dict, stream: bool, sampling_parameters: dict | None,
                        max_tokens: int | None) -> dict[str, np.ndarray]:
    tensors["stream"] = np.array([stream], dtype=np.bool_)
    if sampling_parameters:
        tensors["sampling_parameters"] = _bytes([json.dumps(sampling_parameters)])
    _optional_int(tensors, "max_tokens", max_tokens)
    return tensors


def _llm_tensors(prompt: str | None, messages: list[dict] | None) -> dict[str, np.ndarray]:
    if (prompt is None) == (messages is None):
        raise ValueError("generate: give exactly one of prompt or messages")
    tensors = {"text_input": _bytes([prompt])} if prompt is not None else {"messages": _bytes([json.dumps(messages)])}
    tensors["exclude_input_in_output"] = np.array([True])  # the answer only, also when not streaming
    tensors["return_finish_reason"] = np.array([True])  # vllm_backend's rule: only when asked
    return tensors


def _embeddings(out: dict) -> Embeddings:
    return Embeddings(out["embedding"].astype(np.float32), [bool(t) for t in out["truncated"].reshape(-1)])


def _ranked(passages: list[str], out: dict) -> list[RankedPassage]:
    scores = out["scores"].reshape(-1)
    ranked = [RankedPassage(i, passages[i], float(scores[i])) for i in range(len(passages))]
    return sorted(ranked, key=lambda r: -r.score)


def _passages(out: dict) -> list[Passage]:
    locations = [json.loads(text_of(x) or "{}") for x in out["locations"]] if "locations" in out \
        else [{}] * len(out["scores"])
    return [Passage(i.decode(), s.decode(), t.decode(), float(score), where) for i, s, t, score, where in
            zip(out["passage_ids"], out["sources"], out["passages"], out["scores"], locations)]


def _retrieve_tensors(query: str, vectors: np.ndarray, top_k: int | None, mode: str | None) -> dict:
    tensors = {"embedding": vectors, "query": _bytes([query])}   # the text: BM25, for hybrid retrieval
    _optional_int(tensors, "top_k", top_k)
    if mode is not None:
        tensors["mode"] = _bytes([mode])
    return tensors


def _context(out: dict) -> RagContext:
    return RagContext(json.loads(text_of(out["messages"])), parse_sources(text_of(out["sources"])))


def _absorb(answer: Answer, outputs: dict) -> str:
    """Adds one response to `answer`; returns its new text."""
    delta = text_of(outputs["text_output"]) if "text_output" in outputs else ""
    answer.text += delta
    reason = text_of(outputs["finish_reason"]) if "finish_reason" in outputs else ""
    if reason not in ("", "None"):  # vllm_backend's "None": not finished yet
        answer.finish_reason = reason
    if "sources" in outputs and text_of(outputs["sources"]):
        answer.sources = parse_sources(text_of(outputs["sources"]))
    for name in ("num_input_tokens", "num_output_tokens"):
        if name in outputs:
            count = int(np.asarray(outputs[name]).reshape(-1)[0])
            # streaming: input tokens repeat per response, output tokens count that response only
            setattr(answer, name, count if name == "num_input_tokens" else (getattr(answer, name) or 0) + count)
    return delta


class TextStream:
    """Iterate for the text as it arrives; `answer` is complete once the iteration ends.
    Leaving the loop early (or close()) cancels the request on the server."""

    def __init__(self, responses: Iterator[dict]):
        self._responses = responses
        self.answer = Answer()

    def __iter__(self) -> Iterator[str]:
        for outputs in self._responses:
            delta = _absorb(self.answer, outputs)
            if delta:
                yield delta

    def collect(self) -> Answer:
        for _ in self:
            pass
        return self.answer

    def close(self) -> None:
        self._responses.close()


class AsyncTextStream:
    """TextStream for asyncio: `async for delta in stream`, then `stream.answer`."""

    def __init__(self, responses: AsyncIterator[dict]):
        self._responses = responses
        self.answer = Answer()

    async def __aiter__(self) -> AsyncIterator[str]:
        async for outputs in self._responses:
            delta = _absorb(self.answer, outputs)
            if delta:
                yield delta

    async def collect(self) -> Answer:
        async for _ in self:
            pass
        return self.answer

    async def close(self) -> None:
        await self._responses.aclose()


def _versioned_config(config: dict, version: int) -> str:
    return json.dumps({**config, "version_policy": {"specific": {"versions": [int(version)]}}})


class RagClient:
    """Synchronous client. `url` is host:port (default $RAGSTACK_URL or localhost:8001 / :8000);
    `tls`: connect with TLS (True, or ragstack.tls.TlsOptions; also an https:// or grpcs:// URL)."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", timeout_s: float = 120.0,
                 tls: TlsOptions | bool | None = None):
        from ragstack.transports import GrpcTransport, HttpTransport  # noqa: PLC0415

        if protocol not in DEFAULT_PORTS:
            raise ValueError(f"protocol {protocol!r}: use grpc or http")
        self.url, self.protocol = url or default_url(protocol), protocol
        self.tls = tls_options(self.url, protocol, tls)
        transport = GrpcTransport if protocol == "grpc" else HttpTransport
        self._t = transport(self.url, timeout_s, admin_key.headers(protocol, admin_key.from_environment()), self.tls)

    def embed(self, texts: list[str]) -> Embeddings:
        return _embeddings(self._t.infer(EMBED, {"text": _bytes(texts)}))

    def rerank(self, query: str, passages: list[str]) -> list[RankedPassage]:
        """Passages by reranker score, best first."""
        return _ranked(passages, self._t.infer(RERANK, {"query": _bytes([query]), "passages": _bytes(passages)}))

    def retrieve(self, query: str, top_k: int | None = None, version: str = "",
                 mode: str | None = None) -> list[Passage]:
        """The retriever's top_k passages for `query`, best first; `version` picks an index version,
        `mode` "dense" or "hybrid" (default: the index's)."""
        tensors = _retrieve_tensors(query, self.embed([query]).vectors, top_k, mode)
        return _passages(self._t.infer(RETRIEVER, tensors, version=version))

    def context(self, query: str, top_k: int | None = None, top_n: int | None = None,
                max_tokens: int | None = None) -> RagContext:
        """What the llm would be given for `query` (the rag_context ensemble): messages and sources;
        `max_tokens` as a rag query would ask, which sizes the context."""
        return _context(self._t.infer(RAG_CONTEXT, _context_tensors(query, top_k, top_n, max_tokens)))

    def rag_rerank(self, query: str, passages: list[Passage]) -> list[float]:
        """The rag pipeline's rerank step (model rag_rerank) on retrieved passages: one score each."""
        out = self._t.infer("rag_rerank", {"query": _bytes([query]), "passages": _bytes([p.text for p in passages]),
                                           "retrieval_scores": np.array([p.score for p in passages], np.float32)})
        return [float(x) for x in out["scores"].reshape(-1)]

    def query(self, text: str, top_k: int | None = None, top_n: int | None = None,
              sampling_parameters: dict | None = None, max_tokens: int | None = None,
              stream: bool = True, answer_format: str | None = None,
              max_answer_chars: int | None = None) -> TextStream:
        """Ask the rag ensemble; iterate the result for the answer's text, then read `.answer.sources`.
        answer_format "json": the text is {"answer": ..., "citations": [source numbers]}, the answer at
        most max_answer_chars characters (the server's default: 2000)."""
        tensors = _generation_tensors(_rag_tensors(text, top_k, top_n, answer_format, max_answer_chars), stream,
                                      sampling_parameters, max_tokens)
        return TextStream(self._t.stream(RAG, tensors, stream))

    def generate(self, prompt: str | None = None, messages: list[dict] | None = None,
                 sampling_parameters: dict | None = None, max_tokens: int | None = None,
                 stream: bool = True) -> TextStream:
        """The llm alone, on a plain prompt or chat messages."""
        tensors = _generation_tensors(_llm_tensors(prompt, messages), stream, sampling_parameters, max_tokens)
        return TextStream(self._t.stream(LLM, tensors, stream))

    def models(self) -> list[ModelInfo]:
        return self._t.models()

    def model_config(self, name: str) -> dict:
        """The loaded model's configuration, as Triton's model-config API returns it."""
        return self._t.model_config(name)

    def load(self, name: str, version: int | None = None) -> None:
        """Load (or reload) a model; with `version`, serve exactly that version (a config override
        of the loaded model's config), e.g. to roll the retriever back to an older index."""
        if version is None:
            self._t.load(name)
            return
        self._t.load(name, _versioned_config(self._t.model_config(name), version))

    def unload(self, name: str) -> None:
        self._t.unload(name)

    def close(self) -> None:
        self._t.close()

    def __enter__(self) -> "RagClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRagClient:
    """RagClient for asyncio: the same methods as coroutines; query/generate return an
    AsyncTextStream (`async for delta in stream`)."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", timeout_s: float = 120.0,
                 tls: TlsOptions | bool | None = None):
        from ragstack.aio_transports import AsyncGrpcTransport, AsyncHttpTransport  # noqa: PLC0415

        if protocol not in DEFAULT_PORTS:
            raise ValueError(f"protocol {protocol!r}: use grpc or http")
        self.url, self.protocol = url or default_url(protocol), protocol
        self.tls = tls_options(self.url, protocol, tls)
        transport = AsyncGrpcTransport if protocol == "grpc" else AsyncHttpTransport
        self._t = transport(self.url, timeout_s, admin_key.headers(protocol, admin_key.from_environment()), self.tls)

    async def embed(self, texts: list[str]) -> Embeddings:
        return _embeddings(await self._t.infer(EMBED, {"text": _bytes(texts)}))

    async def rerank(self, query: str, passages: list[str]) -> list[RankedPassage]:
        return _ranked(passages, await self._t.infer(RERANK, {"query": _bytes([query]), "passages": _bytes(passages)}))

    async def retrieve(self, query: str, top_k: int | None = None, version: str = "",
                       mode: str | None = None) -> list[Passage]:
        tensors = _retrieve_tensors(query, (await self.embed([query])).vectors, top_k, mode)
        return _passages(await self._t.infer(RETRIEVER, tensors, version=version))

    async def context(self, query: str, top_k: int | None = None, top_n: int | None = None,
                      max_tokens: int | None = None) -> RagContext:
        return _context(await self._t.infer(RAG_CONTEXT, _context_tensors(query, top_k, top_n, max_tokens)))

    def query(self, text: str, top_k: int | None = None, top_n: int | None = None,
              sampling_parameters: dict | None = None, max_tokens: int | None = None,
              stream: bool = True, answer_format: str | None = None,
              max_answer_chars: int | None = None) -> AsyncTextStream:
        tensors = _generation_tensors(_rag_tensors(text, top_k, top_n, answer_format, max_answer_chars), stream,
                                      sampling_parameters, max_tokens)
        return AsyncTextStream(self._t.stream(RAG, tensors, stream))

    def generate(self, prompt: str | None = None, messages: list[dict] | None = None,
                 sampling_parameters: dict | None = None, max_tokens: int | None = None,
                 stream: bool = True) -> AsyncTextStream:
        tensors = _generation_tensors(_llm_tensors(prompt, messages), stream, sampling_parameters, max_tokens)
        return AsyncTextStream(self._t.stream(LLM, tensors, stream))

    async def models(self) -> list[ModelInfo]:
        return await self._t.models()

    async def load(self, name: str, version: int | None = None) -> None:
        if version is None:
            await self._t.load(name)
            return
        await self._t.load(name, _versioned_config(await self._t.model_config(name), version))

    async def unload(self, name: str) -> None:
        await self._t.unload(name)

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> "AsyncRagClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


__all__ = ["RagClient", "AsyncRagClient", "TextStream", "AsyncTextStream", "RagstackError", "default_url"]
