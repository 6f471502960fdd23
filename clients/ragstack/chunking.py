"""Split documents into overlapping chunks of words, with stable ids.

By words, not tokens: the chunks do not depend on one tokenizer, so the same index can be
embedded by another model. The default of 120 words is ~160 word pieces of all-MiniLM-L6-v2 for
English prose, under its 256-token limit with room for long words; the reranker sees the query and
one chunk together, also within its limit. Consecutive chunks share `overlap` words, so a sentence
cut at a boundary is whole in one of them.

A chunk id is a hash of the document's path, the chunk's index and its text: unchanged documents
give unchanged ids (re-indexing is idempotent), and an edited chunk gets a new id.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ragstack.documents import Document

DEFAULT_CHUNK_WORDS = 120
DEFAULT_OVERLAP_WORDS = 30


@dataclass(frozen=True)
class Chunk:
    id: str
    source: str
    index: int
    text: str


def chunk_id(source: str, index: int, text: str) -> str:
    digest = hashlib.sha256(f"{source}\0{index}\0{text}".encode()).hexdigest()
    return digest[:16]


def split_words(text: str, chunk_words: int = DEFAULT_CHUNK_WORDS,
                overlap_words: int = DEFAULT_OVERLAP_WORDS) -> list[str]:
    """Windows of `chunk_words` words, each starting `chunk_words - overlap_words` after the last;
    the last window ends at the last word. Whitespace is normalised to single spaces."""
    if chunk_words < 1:
        raise ValueError(f"chunk_words is {chunk_words}; it must be at least 1")
    if not 0 <= overlap_words < chunk_words:
        raise ValueError(f"overlap_words is {overlap_words}; it must be 0 to chunk_words - 1 ({chunk_words - 1})")
    words = text.split()
    step = chunk_words - overlap_words
    chunks = []
    for start in range(0, max(len(words), 1), step):
        window = words[start:start + chunk_words]
        if window:
            chunks.append(" ".join(window))
        if start + chunk_words >= len(words):
            break
    return chunks


def chunk_documents(documents: list[Document], chunk_words: int = DEFAULT_CHUNK_WORDS,
                    overlap_words: int = DEFAULT_OVERLAP_WORDS) -> list[Chunk]:
    return [Chunk(chunk_id(doc.source, i, text), doc.source, i, text)
            for doc in documents
            for i, text in enumerate(split_words(doc.text, chunk_words, overlap_words))]
