"""Chunking in the embedder's tokens (ragstack.chunking) with the served embedder's own tokenizer.json:
no chunk over the model's limit, whatever the text (long lines, long words, code, tables, the Python
reference CPython ships); lines kept; overlap in tokens; every token in some chunk; cuts reported; ids
that stay when a document does not change."""
from __future__ import annotations

import bisect

import pydoc_data.topics
import pytest

from ragstack.chunking import ChunkReport, EmbedderTokenizer, chunk_document, chunk_documents, chunk_id, normalize
from ragstack.documents import Document
from ragstack.launcher import ROOT


@pytest.fixture(scope="module")
def tokenizer() -> EmbedderTokenizer:
    return EmbedderTokenizer(ROOT / "model_repository" / "embedder" / "1")


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def covered(doc: Document, chunks, tokenizer) -> bool:
    """Every token of the document lies inside some chunk's span of the text."""
    assert all(doc.text[a:b] == c.text for c in chunks for a, b in [c.chars])
    starts = [c.chars[0] for c in chunks]           # in order; a token lies in one of the last few starting before it
    return all(any(e <= chunks[j].chars[1] for j in range(max(0, i - 3), i))
               for s, e in tokenizer.offsets(doc.text) for i in [bisect.bisect_right(starts, s)])


def test_the_tokenizer_is_the_embedders(tokenizer):
    assert tokenizer.max_length == 256 and tokenizer.specials == 2   # [CLS] ... [SEP]
    assert tokenizer.count(["hello world"]) == [4]


@pytest.mark.parametrize("text", [
    "intro\n" + words(2000) + "\nend",                             # one line far longer than a chunk
    "x" * 5000 + " " + "y" * 3000,                                 # "words" longer than a chunk
    "\n".join(f"| {i} | {'ab ' * (i % 40)} |" for i in range(300)),  # a table of short and long rows
    "ünïcödé 中文字符 " * 800,                                        # one token per CJK character
    "def f(x):\n    return x.__class__.__name__  # " + "y=" * 900,
])
@pytest.mark.parametrize("size, overlap", [(256, 64), (192, 32), (16, 0)])
def test_no_chunk_exceeds_its_size_and_every_token_is_in_one(tokenizer, text, size, overlap):
    doc = Document("a.md", normalize(text))
    report = ChunkReport(tokenizer.max_length, size, overlap)
    chunks = chunk_document(doc, tokenizer, size, overlap, report)
    counted = tokenizer.count([c.text for c in chunks])
    assert max(counted) <= size and counted == [c.tokens for c in chunks]
    assert report.summary()["over_limit"] == 0 and report.summary()["tokens"]["max"] <= size
    assert covered(doc, chunks, tokenizer)


def test_the_python_reference_chunks_within_the_limit(tokenizer):
    """The evaluation corpus: 79 documents, prose, grammar, tables and code."""
    docs = [Document(f"{name}.txt", normalize(text)) for name, text in pydoc_data.topics.topics.items()]
    report = ChunkReport(tokenizer.max_length, 256, 32)
    chunks = chunk_documents(docs, tokenizer, 256, 32, report)
    summary = report.summary()
    assert summary["chunks"] == len(chunks) > 400 and summary["over_limit"] == 0
    assert max(tokenizer.count([c.text for c in chunks])) <= 256
    assert len({c.id for c in chunks}) == len(chunks)


def test_chunks_end_at_line_ends_and_keep_lines(tokenizer):
    text = "\n".join(f"line {i}: " + words(5, f"l{i}x") for i in range(60))
    doc = Document("lines.md", text)
    report = ChunkReport(256, 96, 16)
    chunks = chunk_document(doc, tokenizer, 96, 16, report)
    assert len(chunks) > 3 and not report.cuts
    for chunk in chunks:
        assert chunk.text in text and "\n" in chunk.text
        assert chunk.text.splitlines()[-1] == text.splitlines()[chunk.lines[1] - 1]   # ends with a whole line
    assert chunks[0].lines[0] == 1 and chunks[-1].lines[1] == 60


def test_overlap_is_in_tokens(tokenizer):
    doc = Document("o.md", "\n".join(words(8, f"s{i}x") for i in range(100)))
    chunks = chunk_document(doc, tokenizer, 128, 40)
    for a, b in zip(chunks, chunks[1:]):
        head = b.text.splitlines()[0]
        assert head in a.text                                   # the next chunk starts inside this one
        overlap = tokenizer.count([b.text[:b.text.index(head) + len(head)]])[0] - 2
        assert 0 < overlap <= 40
    assert not chunk_document(doc, tokenizer, 128, 0)[1].text.splitlines()[0] in chunks[0].text


def test_a_cut_line_is_reported(tokenizer):
    doc = Document("long.md", "short line\n" + words(600) + "\nshort again")
    report = ChunkReport(256, 128, 16)
    chunk_document(doc, tokenizer, 128, 16, report)
    (cut,) = report.cuts
    assert (cut.source, cut.line) == ("long.md", 2) and cut.tokens > 1000 and cut.chunks >= 9
    assert str(cut).startswith("long.md: line 2 (") and report.summary()["lines_cut"] == 1


def test_pages_of_a_paged_document(tokenizer):
    pages = [words(150, f"p{p}x") + "\n\n" for p in range(3)]
    starts = tuple(sum(len(p) for p in pages[:i]) for i in range(3))
    chunks = chunk_document(Document("d.pdf", "".join(pages), starts), tokenizer, 200, 20)
    assert chunks[0].pages[0] == 1 and chunks[-1].pages[1] == 3
    assert all(1 <= c.pages[0] <= c.pages[1] <= 3 for c in chunks)


def test_ids_are_stable_and_change_with_the_text(tokenizer):
    docs = [Document("a.md", "\n".join(words(10, f"a{i}x") for i in range(80))), Document("b.md", words(50, "b"))]
    first = chunk_documents(docs, tokenizer, 96, 16)
    assert [c.id for c in first] == [c.id for c in chunk_documents(docs, tokenizer, 96, 16)]
    assert len({c.id for c in first}) == len(first)
    assert first[0].id == chunk_id("a.md", 0, first[0].text)
    edited = chunk_documents([docs[0], Document("b.md", words(50, "b") + " new")], tokenizer, 96, 16)
    assert [c.id for c in edited][:-1] == [c.id for c in first][:-1]   # a.md untouched
    assert edited[-1].id != first[-1].id
    renamed = chunk_documents([Document("c.md", docs[1].text)], tokenizer, 96, 16)
    assert renamed[0].id != first[-1].id                                # the path is part of the id


@pytest.mark.parametrize("size, overlap, message", [(2, 0, "chunk_tokens"), (257, 0, "chunk_tokens"),
                                                    (100, 60, "overlap_tokens"), (100, -1, "overlap_tokens")])
def test_bad_chunking_settings(tokenizer, size, overlap, message):
    with pytest.raises(ValueError, match=message):
        chunk_document(Document("a.md", "a b c"), tokenizer, size, overlap)
