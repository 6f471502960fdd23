"""Split documents into overlapping chunks measured in the embedder's own tokens, with stable ids.

Tokens, not words: a chunk is at most `chunk_tokens` tokens of the embedder's tokenizer (its
tokenizer.json, the one the served `embed_tokenizer` uses), special tokens included, and never more
than the model reads (`max_length`, 256 for all-MiniLM-L6-v2), so no chunk's end goes unembedded.
Consecutive chunks share up to `overlap_tokens` tokens, so a sentence at a boundary is whole in one.

Line structure is kept: a chunk is a slice of the document's text (its newlines and indentation, so
tables and code keep their lines). A chunk ends at a line end where one lies in its second half;
only a line longer than that is cut, at a word boundary (or, in a "word" longer than a chunk, between
tokens), and every cut is reported (`ChunkReport.cuts`). An overlap starts at a line start where one
lies in it, else at a word boundary.

A chunk id hashes the document's path, the chunk's text and which occurrence of that text in the
document it is (not its position): unchanged documents give unchanged ids, so an incremental build
re-embeds only chunks that are new (indexer.py); an edited document gets new ids from its first edit on.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ragstack.documents import Document

DEFAULT_CHUNK_TOKENS = 192
DEFAULT_OVERLAP_TOKENS = 32
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


@dataclass(frozen=True)
class Chunk:
    id: str
    source: str
    index: int                       # position within the document
    text: str
    tokens: int                      # embedder tokens, special tokens included
    lines: tuple[int, int]           # first and last line (1-based) in the document's text
    pages: tuple[int, int] | None = None   # first and last page, for paged documents (PDF)
    chars: tuple[int, int] = (0, 0)  # [start, end) in the document's text


@dataclass(frozen=True)
class Cut:
    """A line longer than a chunk's room, split across chunks."""
    source: str
    line: int
    tokens: int                      # the line's length in tokens
    chunks: int                      # chunks its text is spread over

    def __str__(self) -> str:
        return f"{self.source}: line {self.line} ({self.tokens:,} tokens) is cut across {self.chunks} chunks"


@dataclass
class ChunkReport:
    """What chunking made: counts and token lengths, for the build report."""
    limit: int                       # the embedder's max_length
    chunk_tokens: int
    overlap_tokens: int
    lengths: list[int] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)

    def summary(self) -> dict:
        lengths = sorted(self.lengths)

        def pct(q: float) -> int:
            return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else 0
        return {"chunks": len(lengths), "limit": self.limit, "chunk_tokens": self.chunk_tokens,
                "overlap_tokens": self.overlap_tokens, "over_limit": sum(n > self.limit for n in lengths),
                "tokens": {"min": lengths[0] if lengths else 0, "median": pct(0.5), "p95": pct(0.95),
                           "max": lengths[-1] if lengths else 0, "total": sum(lengths)},
                "lines_cut": len(self.cuts)}


class EmbedderTokenizer:
    """The embedder's tokenizer.json, for counting: no truncation, no padding."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer  # noqa: PLC0415

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{file}: no tokenizer.json; give the embedder's version folder or its tokenizer.json")
        raw = json.loads(file.read_text())
        self.path = file
        self.max_length = int((raw.get("truncation") or {}).get("max_length") or 512)
        self.digest = hashlib.sha256(file.read_bytes()).hexdigest()[:16]
        self._tokenizer = Tokenizer.from_file(str(file))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.specials = len(self._tokenizer.encode("", add_special_tokens=True).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Each token's (start, end) in `text`, special tokens left out."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).offsets)

    def count(self, texts: list[str]) -> list[int]:
        """Tokens of each text as the embedder sees it, special tokens included."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(texts, add_special_tokens=True)]


def normalize(text: str) -> str:
    """Line ends as \\n, tabs as spaces, no trailing spaces; the lines themselves stay where they
    are, so line numbers are the file's."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
    return _TRAILING_SPACE.sub("\n", text + "\n")[:-1]


def chunk_id(source: str, occurrence: int, text: str) -> str:
    digest = hashlib.sha256(f"{source}\0{occurrence}\0{text}".encode()).hexdigest()
    return digest[:16]


def check_settings(tokenizer: EmbedderTokenizer, chunk_tokens: int, overlap_tokens: int) -> None:
    if not tokenizer.specials < chunk_tokens <= tokenizer.max_length:
        raise ValueError(f"chunk_tokens is {chunk_tokens}; it must be {tokenizer.specials + 1} to "
                         f"{tokenizer.max_length}, the embedder's limit (special tokens included)")
    room = chunk_tokens - tokenizer.specials
    if not 0 <= overlap_tokens <= room // 2:
        raise ValueError(f"overlap_tokens is {overlap_tokens}; it must be 0 to {room // 2} (half a chunk)")


def _windows(text: str, offsets: list[tuple[int, int]], room: int, overlap: int) -> list[tuple[int, int]]:
    """Token windows [start, end) of at most `room` tokens: ends at line ends where possible."""
    n = len(offsets)
    line_start = [i == 0 or "\n" in text[offsets[i - 1][1]:offsets[i][0]] for i in range(n)]
    word_start = [i == 0 or offsets[i][0] > offsets[i - 1][1] for i in range(n)]
    windows, start = [], 0
    while start < n:
        hard = min(start + room, n)
        end = hard
        if hard < n:
            floor = start + max(1, room // 2)
            end = next((e for e in range(hard, floor, -1) if line_start[e]), 0) \
                or next((e for e in range(hard, floor, -1) if word_start[e]), hard)
        windows.append((start, end))
        if end >= n:
            break
        nxt = end
        if overlap:
            target = max(end - overlap, start + 1)
            nxt = next((t for t in range(target, end) if line_start[t]), 0) \
                or next((t for t in range(target, end) if word_start[t]), end)
        start = nxt
    return windows


def chunk_document(doc: Document, tokenizer: EmbedderTokenizer, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                   overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
                   report: ChunkReport | None = None) -> list[Chunk]:
    check_settings(tokenizer, chunk_tokens, overlap_tokens)
    text = doc.text
    offsets = tokenizer.offsets(text)
    if not offsets:
        return []
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    room = chunk_tokens - tokenizer.specials
    pieces = []
    for start, end in _windows(text, offsets, room, overlap_tokens):
        while True:   # the slice alone almost always tokenizes to end - start tokens; where not, shrink it
            body = text[offsets[start][0]:offsets[end - 1][1]].strip()
            tokens = tokenizer.count([body])[0]
            if tokens <= chunk_tokens or end - start == 1:
                break
            end = max(start + 1, end - (tokens - chunk_tokens))
        pieces.append((body, tokens, offsets[start][0], offsets[end - 1][1]))
    chunks, seen = [], {}
    for i, (body, tokens, first, last) in enumerate(pieces):
        lines = (bisect.bisect_right(line_starts, first), bisect.bisect_right(line_starts, max(first, last - 1)))
        pages = None
        if doc.page_starts:
            pages = (bisect.bisect_right(doc.page_starts, first),
                     bisect.bisect_right(doc.page_starts, max(first, last - 1)))
        occurrence = seen.get(body, 0)
        seen[body] = occurrence + 1
        chunks.append(Chunk(chunk_id(doc.source, occurrence, body), doc.source, i, body, tokens, lines, pages,
                            (first, last)))
    if report is not None:
        report.lengths.extend(c.tokens for c in chunks)
        report.cuts.extend(_cuts(doc.source, text, line_starts, pieces, tokenizer))
    return chunks


def _cuts(source: str, text: str, line_starts: list[int], pieces: list[tuple], tokenizer) -> list[Cut]:
    """The lines a chunk ends inside of (text follows on the same line), with the chunks they span."""
    cuts = []
    for body, _, first, last in pieces[:-1]:
        line = bisect.bisect_right(line_starts, max(first, last - 1))
        start = line_starts[line - 1]
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if not text[last:end].strip() or (cuts and cuts[-1].line == line):
            continue
        spread = sum(1 for _, _, f, la in pieces if f < end and la > start)
        cuts.append(Cut(source, line, tokenizer.count([text[start:end]])[0] - tokenizer.specials, spread))
    return cuts


    return chunks


def chunk_documents(documents: list[Document], tokenizer: EmbedderTokenizer,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS, overlap_tokens: int = DEFAULT_OVERLAP_TOKENS,
                    report: ChunkReport | None = None) -> list[Chunk]:
    return [chunk for doc in documents
            for chunk in chunk_document(doc, tokenizer, chunk_tokens, overlap_tokens, report)]
