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
    score: float                 # cosine similarity to the query (dense), fused rank score (hybrid)
    location: dict = field(default_factory=dict, compare=False)   # {"chunk", "lines", "pages"} where known


@dataclass(frozen=True)
class Source:
    n: int                       # the citation number [n] in the prompt
    source: str
    passage_id: str
    score: float                 # reranker score
    # where the passage is in its document (indexes built with token chunking), and whether it was
    # trimmed to fit the llm's context; not compared, so sources of older servers compare equal
    chunk: int | None = field(default=None, compare=False)
    lines: tuple[int, int] | None = field(default=None, compare=False)
    pages: tuple[int, int] | None = field(default=None, compare=False)
    trimmed: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class DocumentSource:
    """One document among the sources: its passages' citation numbers, where they are, the best score."""
    source: str
    score: float                 # the best of its passages' scores
    citations: list[int]         # the [n] of its passages, in citation order
    chunks: list[int]
    lines: list[tuple[int, int]]  # each passage's span, in the document's order
    pages: list[tuple[int, int]]

    def spans(self) -> str:
        """"pages 2-3, 7" or "lines 1-40, 80-120", merged where they touch; "" when unknown."""
        spans, word = (self.pages, "pages") if self.pages else (self.lines, "lines")
        merged: list[list[int]] = []
        for first, last in sorted(spans):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        return f"{word} " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in merged) if merged else ""


def _span(value) -> tuple[int, int] | None:
    return (int(value[0]), int(value[1])) if isinstance(value, list) and len(value) == 2 else None


def parse_sources(raw: str | bytes) -> list[Source]:
    items = json.loads(raw)
    return [Source(int(s["n"]), s["source"], s["passage_id"], float(s["score"]),
                   int(s["chunk"]) if s.get("chunk") is not None else None, _span(s.get("lines")),
                   _span(s.get("pages")), bool(s.get("trimmed", False))) for s in items]


def documents_of(sources: list[Source]) -> list[DocumentSource]:
    """The sources grouped by document, best document first (the order of its best passage)."""
    groups: dict[str, list[Source]] = {}
    for s in sources:
        groups.setdefault(s.source, []).append(s)
    documents = []
    for name, group in groups.items():
        in_order = sorted(group, key=lambda s: (s.chunk if s.chunk is not None else s.n))
        documents.append(DocumentSource(name, max(s.score for s in group), [s.n for s in group],
                                        [s.chunk for s in in_order if s.chunk is not None],
                                        [s.lines for s in in_order if s.lines], [s.pages for s in in_order if s.pages]))
    return documents


@dataclass(frozen=True)
class RagContext:
    messages: list[dict]         # the chat messages the llm would get
    sources: list[Source]

    @property
    def documents(self) -> list[DocumentSource]:
        return documents_of(self.sources)


@dataclass
class Answer:
    """What a finished query / generate stream produced."""
    text: str = ""
    finish_reason: str = ""
    sources: list[Source] = field(default_factory=list)
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None

    @property
    def documents(self) -> list[DocumentSource]:
        """The sources per document: file, citation numbers, chunk spans, best score."""
        return documents_of(self.sources)
