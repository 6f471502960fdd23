"""Typed results of the client API, and RagstackError with the Triton status code."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

# Triton's words for a status code at the start of a reason ("Internal: ValueError: ...").
_STATUS_PREFIX = re.compile("^(?:Internal|Invalid argument|Not found|Unavailable|Unknown|Already exists|"
                            "Unsupported): ")


class RagstackError(Exception):
    """A failed request. `code` is Triton's status code: INVALID_ARG, NOT_FOUND, UNAVAILABLE,
    INTERNAL, CANCELLED, UNSUPPORTED, ALREADY_EXISTS, or UNKNOWN where Triton sent none and the
    message is of no family ragstack.error_codes knows. No answer from the server is UNAVAILABLE,
    with a message naming the likely cause (ragstack.reachability)."""

    def __init__(self, message: str, code: str = "UNKNOWN"):
        super().__init__(f"[{code}] {message}")
        self.message = message
        self.code = code


@dataclass(frozen=True)
class ModelInfo:
    name: str
    version: str
    state: str
    reason: str = ""             # why it is not READY: Triton's whole text, tracebacks included

    @property
    def short_reason(self) -> str:
        return last_meaningful_line(self.reason)


def last_meaningful_line(text: str) -> str:
    """A failed load's reason in one line: the exception that failed it, without the stack the Python
    backend appends ("At: ...") or a quoted traceback's frames (indented lines)."""
    head, at, _ = text.rpartition("\nAt:\n")
    lines = [line.rstrip() for line in (head if at else text).splitlines()
             if line.strip() and not line[0].isspace() and line.strip() != ";"]
    return _STATUS_PREFIX.sub("", lines[-1]) if lines else ""


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
