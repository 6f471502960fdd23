"""Documents, chunking, stable ids, path safety and the index format (re-indexing through the
server: server/test_index_build.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ragstack import index_store, indexer
from ragstack.chunking import chunk_documents, chunk_id, split_words
from ragstack.documents import Document, DocumentError, UnsafePathError, html_to_text, read_folder


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


# --- chunking ---------------------------------------------------------------------------------

def test_windows_overlap_and_cover_the_text():
    chunks = split_words(words(250), chunk_words=100, overlap_words=20)
    assert [len(c.split()) for c in chunks] == [100, 100, 90]
    assert chunks[0].split()[-20:] == chunks[1].split()[:20]         # 20 words shared
    assert chunks[-1].split()[-1] == "w249"                         # the last word is in the last chunk
    assert split_words(words(100), 100, 20) == [words(100)]         # an exact fit is one chunk
    assert split_words("  a\n\n b\t c ", 100, 20) == ["a b c"]       # whitespace normalised
    assert split_words("", 100, 20) == []


@pytest.mark.parametrize("chunk_words, overlap, message", [(0, 0, "chunk_words"), (10, 10, "overlap_words"),
                                                           (10, -1, "overlap_words")])
def test_bad_chunking_settings(chunk_words, overlap, message):
    with pytest.raises(ValueError, match=message):
        split_words("a b c", chunk_words, overlap)


def test_chunk_ids_are_stable_and_change_with_the_text():
    docs = [Document("a.md", words(150, "a")), Document("b.md", words(50, "b"))]
    first = chunk_documents(docs, 100, 20)
    assert [c.id for c in first] == [c.id for c in chunk_documents(docs, 100, 20)]
    assert len({c.id for c in first}) == len(first) == 3
    assert first[0].id == chunk_id("a.md", 0, first[0].text)
    edited = chunk_documents([docs[0], Document("b.md", words(50, "b") + " new")], 100, 20)
    assert [c.id for c in edited][:2] == [c.id for c in first][:2]  # a.md untouched
    assert edited[2].id != first[2].id
    renamed = chunk_documents([Document("c.md", docs[1].text)], 100, 20)
    assert renamed[0].id != first[2].id                              # the path is part of the id


# --- documents --------------------------------------------------------------------------------

def test_html_text_has_title_and_blocks_without_script():
    text = html_to_text("<html><head><title>T &amp; U</title><style>p{}</style></head><body><h1>Head</h1>"
                        "<p>One <b>two</b></p><script>var x = 1;</script><ul><li>three</li></ul></body></html>")
    assert text.splitlines() == ["T & U", "Head", "One two", "three"]


def test_reads_supported_files_sorted_and_skips_the_rest(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# B\nbee")
    (tmp_path / "a.txt").write_text("ay")
    (tmp_path / "c.html").write_text("<p>sea</p>")
    (tmp_path / "d.pdf").write_bytes(b"%PDF")
    (tmp_path / ".hidden.md").write_text("no")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.md").write_text("no")
    (tmp_path / "blank.md").write_text("  \n")
    docs = read_folder(tmp_path)
    assert [(d.source, d.text) for d in docs] == [("a.txt", "ay"), ("c.html", "sea"), ("sub/b.md", "# B\nbee")]


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
    """A FIFO named like a document would block an open() forever; it is refused at once."""
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
