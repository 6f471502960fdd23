"""Documents (text, Markdown, HTML, PDF, per-file errors), path safety and the index format (chunking:
test_chunking.py; re-indexing through the server: server/test_index_build.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ragstack import index_store, indexer
from pdf_files import pdf_bytes
from ragstack.documents import DocumentError, UnsafePathError, html_to_text, pdf_to_text, read_folder


# --- documents --------------------------------------------------------------------------------

def test_html_text_has_title_and_blocks_without_script():
    text = html_to_text("<html><head><title>T &amp; U</title><style>p{}</style></head><body><h1>Head</h1>"
                        "<p>One <b>two</b></p><script>var x = 1;</script><ul><li>three</li></ul></body></html>")
    assert text.splitlines() == ["T & U", "Head", "One two", "three"]


def test_html_keeps_code_and_table_rows():
    text = html_to_text("<h1>Code</h1><pre>def f(x):\n    return  x\n</pre>"
                        "<table><tr><th>name</th><th>value</th></tr><tr><td>a</td><td>1</td></tr></table>")
    assert text.splitlines() == ["Code", "def f(x):", "    return  x", "name | value", "a | 1"]


def test_reads_supported_files_sorted_and_skips_the_rest(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# B\nbee")
    (tmp_path / "a.txt").write_text("ay")
    (tmp_path / "c.html").write_text("<p>sea</p>")
    (tmp_path / "d.pdf").write_bytes(pdf_bytes([["dee"]]))
    (tmp_path / "e.docx").write_bytes(b"PK")
    (tmp_path / ".hidden.md").write_text("no")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.md").write_text("no")
    (tmp_path / "blank.md").write_text("  \n")
    docs = read_folder(tmp_path)
    assert [(d.source, d.text.strip()) for d in docs] == [("a.txt", "ay"), ("c.html", "sea"), ("d.pdf", "dee"),
                                                          ("sub/b.md", "# B\nbee")]


def test_markdown_keeps_its_lines_and_indentation(tmp_path):
    (tmp_path / "t.md").write_text("# Title\r\n\n| a | b |\n|---|---|\n| 1 | 2 |   \n\n```\ndef f():\n\treturn 1\n```\n")
    (doc,) = read_folder(tmp_path)
    assert doc.text.splitlines() == ["# Title", "", "| a | b |", "|---|---|", "| 1 | 2 |", "", "```", "def f():",
                                     "    return 1", "```"]


def test_pdf_pages_and_where_they_start():
    text, starts = pdf_to_text(pdf_bytes([["First page, line one", "line two"], ["Second (page)"]]))
    assert text.splitlines()[:2] == ["First page, line one", "line two"]
    assert starts[0] == 0 and text[starts[1]:].startswith("Second (page)")


def test_a_file_that_cannot_be_read_is_reported_and_the_rest_read(tmp_path):
    (tmp_path / "good.md").write_text("fine")
    (tmp_path / "damaged.pdf").write_bytes(b"%PDF-1.4\n1 0 obj << /Type /Catalog")
    (tmp_path / "empty.pdf").write_bytes(pdf_bytes([[]]))
    (tmp_path / "huge.txt").write_bytes(b"x" * 11 * 2**20)
    os.mkfifo(tmp_path / "pipe.md")
    errors = []
    assert [d.source for d in read_folder(tmp_path, errors)] == ["good.md"]
    said = {e.source: e.message for e in errors}
    assert set(said) == {"damaged.pdf", "empty.pdf", "huge.txt", "pipe.md"}
    assert said["damaged.pdf"].startswith("cannot read the PDF")
    assert "no text in its 1 page(s)" in said["empty.pdf"]
    assert "larger than 10 MiB" in said["huge.txt"] and "not a regular file" in said["pipe.md"]
    with pytest.raises(DocumentError, match="damaged.pdf: cannot read the PDF"):
        read_folder(tmp_path)                      # without a list: the first one raises


def test_symlinks_outside_the_folder_are_rejected(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("secret")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "ok.md").write_text("fine")

    (corpus / "link.md").symlink_to(outside / "secret.md")
    with pytest.raises(UnsafePathError, match="link.md is a symlink to .*outside"):
        read_folder(corpus)
    (corpus / "link.md").unlink()

    (corpus / "dir").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="dir is a symlink"):
        read_folder(corpus)
    (corpus / "dir").unlink()

    (corpus / "dotdot.md").symlink_to("../outside/secret.md")     # `..` in the link: resolved, outside
    with pytest.raises(UnsafePathError, match="dotdot.md"):
        read_folder(corpus)
    (corpus / "dotdot.md").unlink()

    (corpus / "alias.md").symlink_to(corpus / "ok.md")             # inside: read under the link's name
    assert [d.source for d in read_folder(corpus)] == ["alias.md", "ok.md"]
    assert [d.source for d in read_folder(corpus / ".." / "corpus")] == ["alias.md", "ok.md"]


def test_links_out_from_a_subfolder_and_through_a_chain_are_rejected(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.md").write_text("secret")
    corpus = tmp_path / "corpus"
    (corpus / "sub" / "deeper").mkdir(parents=True)
    (corpus / "sub" / "deeper" / "up.md").symlink_to("../../../outside/secret.md")
    with pytest.raises(UnsafePathError, match="up.md is a symlink"):
        read_folder(corpus)
    (corpus / "sub" / "deeper" / "up.md").unlink()
    (corpus / "hop.md").symlink_to(corpus / "sub" / "next.md")      # inside -> inside -> outside
    (corpus / "sub" / "next.md").symlink_to(tmp_path / "outside" / "secret.md")
    with pytest.raises(UnsafePathError, match="outside"):
        read_folder(corpus)


def test_only_regular_files_are_read(tmp_path):
    """A FIFO named like a document would block an open() forever; it is refused at once (and, given a
    list, reported there: test_a_file_that_cannot_be_read_is_reported_and_the_rest_read)."""
    (tmp_path / "ok.md").write_text("fine")
    os.mkfifo(tmp_path / "pipe.md")
    with pytest.raises(DocumentError, match="pipe.md is not a regular file"):
        read_folder(tmp_path)


def test_index_build_reports_an_unsafe_folder_without_reading_it(tmp_path, capsys):
    from ragstack.cli import main

    (tmp_path / "outside.md").write_text("secret")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "link.md").symlink_to(tmp_path / "outside.md")
    code = main(["index", "build", str(corpus), "--url", "127.0.0.1:1", "--model-dir", str(tmp_path / "retriever")])
    assert code == 2 and "link.md is a symlink to" in capsys.readouterr().err
    assert not (tmp_path / "retriever").exists()


def test_not_a_folder(tmp_path):
    with pytest.raises(DocumentError, match="is not a folder"):
        read_folder(tmp_path / "missing")


# --- index format -----------------------------------------------------------------------------

def test_hnsw_and_flat_versions_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    passages = [index_store.Passage(f"id{i}", f"s{i}.md", 0, f"text {i}") for i in range(300)]
    for version, kind in ((1, "flat"), (2, "hnsw")):
        written = index_store.write_version(tmp_path, version, vectors, passages, {"fingerprint": kind}, kind)
        assert written.manifest["index_type"] == kind and written.manifest["count"] == 300
        index = index_store.load_index(written.path)
        query = vectors[42:43] / np.linalg.norm(vectors[42])
        scores, rows = index.search(query, 5)
        assert rows[0][0] == 42 and scores[0][0] == pytest.approx(1.0, abs=1e-5)
        assert index_store.load_passages(written.path)[42].id == "id42"
    assert index_store.versions(tmp_path) == [1, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no staging left behind
    index, kind = index_store.make_index(vectors[:10])
    assert kind == "flat"   # auto: flat below HNSW_MIN_VECTORS
    stored = index_store.load_vectors(tmp_path / "2")           # what an incremental build reuses
    assert np.allclose(stored[42], vectors[42] / np.linalg.norm(vectors[42]), atol=1e-6)


def test_a_version_has_bm25_over_its_passages(tmp_path):
    texts = ["str.removeprefix(prefix) returns a copy without the prefix", "the while statement repeats",
             "pdb is the Python debugger"]
    passages = [index_store.Passage(f"id{i}", "t.md", i, t, 12, [i + 1, i + 1]) for i, t in enumerate(texts)]
    written = index_store.write_version(tmp_path, 1, np.eye(3, dtype=np.float32), passages, {})
    bm25 = index_store.load_bm25(written.path)
    result = bm25.retrieve(index_store.bm25_tokens(["removeprefix"]), k=3, show_progress=False)
    assert result.documents[0][0] == 0 and result.scores[0][0] > 0 == result.scores[0][1]
    row = index_store.load_passages(written.path)[1]
    assert row.location() == {"chunk": 1, "lines": [2, 2]} and row.tokens == 12
