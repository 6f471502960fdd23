"""Typed results of the client API, and RagstackError with the Triton status code."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

# Triton status codes (TRITONSERVER_Error_Code) as the two protocols carry them.
_GRPC_CODES = {
    "INVALID_ARGUMENT": "INVALID_ARG", "NOT_FOUND": "NOT_FOUND", "UNAVAILABLE": "UNAVAILABLE",
    "INTERNAL": "INTERNAL", "CANCELLED": "CANCELLED", "UNIMPLEMENTED": "UNSUPPORTED",
    "ALREADY_EXISTS": "ALREADY_EXISTS", "DEADLINE_EXCEEDED": "UNAVAILABLE", "UNKNOWN": "UNKNOWN",
}
_HTTP_CODES = {400: "INVALID_ARG", 404: "NOT_FOUND", 409: "ALREADY_EXISTS", 499: "CANCELLED",
               500: "INTERNAL", 501: "UNSUPPORTED", 503: "UNAVAILABLE"}


class RagstackError(Exception):
    """A failed request. `code` is Triton's status code: INVALID_ARG, NOT_FOUND, UNAVAILABLE,
    INTERNAL, CANCELLED, UNSUPPORTED, ALREADY_EXISTS or UNKNOWN (e.g. an SSE error event, which
    carries no status)."""

    def __init__(self, message: str, code: str = "UNKNOWN"):
        super().__init__(f"[{code}] {message}")
        self.message = message
        self.code = code


def code_from_grpc(status: str | None) -> str:
    name = (status or "").rsplit(".", 1)[-1]   # "StatusCode.INVALID_ARGUMENT"
    return _GRPC_CODES.get(name, "UNKNOWN")


def code_from_http(status: int | str | None) -> str:
    try:
        return _HTTP_CODES.get(int(status), "UNKNOWN")
    except (TypeError, ValueError):
        return "UNKNOWN"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray          # [N, D] float32, unit length
    truncated: list[bool]        # text i was cut at the embedder's token limit


@dataclass(frozen=True)
class RankedPassage:
    index: int                   # position in the passages sent
    passage: str
    score: float


@dataclass(frozen=True)
class Passage:
    id: str
    source: str
    text: str
    score: float                 # cosine similarity to the query


@dataclass(frozen=True)
class Source:
    n: int                       # the citation number [n] in the prompt
    source: str
    passage_id: str
    score: float                 # reranker score


def parse_sources(raw: str | bytes) -> list[Source]:
    items = json.loads(raw)
    return [Source(int(s["n"]), s["source"], s["passage_id"], float(s["score"])) for s in items]


@dataclass(frozen=True)
class RagContext:
    messages: list[dict]         # the chat messages the llm would get
    sources: list[Source]


@dataclass
class Answer:
    """What a finished query / generate stream produced."""
    text: str = ""
    finish_reason: str = ""
    sources: list[Source] = field(default_factory=list)
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
