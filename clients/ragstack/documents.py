"""Read the documents of a folder for indexing: .txt, .md and .html, never anything outside it.

Path safety: every path is checked after resolving symlinks and `..`, against the resolved
folder. A symlink (file or folder) whose target lies outside the folder fails the whole read
with UnsafePathError, rather than being skipped silently; a symlinked folder inside is not
followed (its files are read under their real path already). Hidden files and folders are skipped.
Files are opened relative to their folder's descriptor with O_NOFOLLOW, so neither a file nor a
folder on the way swapped for a link after the check is followed; only regular files are read
(O_NONBLOCK: a FIFO named like a document would block the open forever).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

TEXT_SUFFIXES = {".txt", ".md", ".markdown"}
HTML_SUFFIXES = {".html", ".htm"}
MAX_FILE_BYTES = 10 << 20


class DocumentError(ValueError):
    """The folder cannot be read as asked; the message names the path and the rule."""


class UnsafePathError(DocumentError):
    """A path that resolves outside the folder being indexed."""


@dataclass(frozen=True)
class Document:
    source: str   # path relative to the folder, with '/' separators
    text: str


class _HTMLText(HTMLParser):
    """Visible text of an HTML page: <title> first, blocks on their own lines, no script/style."""
    SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    BLOCKS = {"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "tr",
              "table", "section", "article", "blockquote", "dt", "dd", "hr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.parts: list[str] = []
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skip_depth += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP and self._skip_depth:
            self._skip_depth -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title.append(data)
        elif not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    title = " ".join("".join(parser.title).split())
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    body = "\n".join(line for line in lines if line)
    return f"{title}\n{body}" if title and not body.startswith(title) else body


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _check_link(path: Path, root: Path) -> Path:
    target = path.resolve()
    if not _inside(target, root):
        raise UnsafePathError(f"{path.relative_to(root)} is a symlink to {target}, outside {root}; "
                              "remove it or index its target's folder")
    return target


def _read(name: str | Path, shown: Path, dir_fd: int | None = None) -> bytes:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: the file became a link after the check
        raise DocumentError(f"{shown}: cannot open ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise DocumentError(f"{shown} is not a regular file (a FIFO, device or socket); remove it")
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"{shown} is larger than {MAX_FILE_BYTES >> 20} MiB, the limit per document")
    return data


def read_folder(folder: str | os.PathLike) -> list[Document]:
    """The folder's documents, sorted by path; whitespace-only documents are left out."""
    root = Path(folder).resolve()
    if not root.is_dir():
        raise DocumentError(f"{folder} is not a folder")
    documents = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in dirnames:
            if (here / name).is_symlink():
                _check_link(here / name, root)   # raises when outside; not followed either way
        for name in sorted(filenames):
            path = here / name
            suffix = path.suffix.lower()
            if name.startswith(".") or suffix not in TEXT_SUFFIXES | HTML_SUFFIXES:
                continue
            if path.is_symlink():
                data = _read(_check_link(path, root), path)
            else:
                data = _read(name, path, dir_fd)
            text = data.decode("utf-8", errors="replace")
            if suffix in HTML_SUFFIXES:
                text = html_to_text(text)
            if text.strip():
                documents.append(Document(path.relative_to(root).as_posix(), text))
    return sorted(documents, key=lambda d: d.source)
