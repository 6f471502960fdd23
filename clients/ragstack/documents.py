"""Read the documents of a folder for indexing: .txt, .md, .html and .pdf, never anything outside it.

Text and Markdown are read as they are (their lines kept); HTML as its visible text, a line per block,
<pre> kept verbatim and table cells separated by " | "; PDF as each page's text (pypdf), the pages'
start offsets kept so that chunks can say which pages they come from. A file that cannot be read as
its kind (a damaged or encrypted PDF, a PDF without text, one over MAX_FILE_BYTES, not a regular file)
is a per-file error: given a list, read_folder reports it there and reads on.

Path safety: every path is checked after resolving symlinks and `..`, against the resolved
folder. A symlink (file or folder) whose target lies outside the folder fails the whole read
with UnsafePathError, rather than being skipped silently; a symlinked folder inside is not
followed (its files are read under their real path already). Hidden files and folders are skipped.
Files are opened relative to their folder's descriptor with O_NOFOLLOW, so neither a file nor a
folder on the way swapped for a link after the check is followed; only regular files are read
(O_NONBLOCK: a FIFO named like a document would block the open forever).
"""
from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

TEXT_SUFFIXES = {".txt", ".md", ".markdown"}
HTML_SUFFIXES = {".html", ".htm"}
PDF_SUFFIXES = {".pdf"}
SUFFIXES = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
MAX_FILE_BYTES = 10 << 20


class DocumentError(ValueError):
    """The folder cannot be read as asked; the message names the path and the rule."""


class UnsafePathError(DocumentError):
    """A path that resolves outside the folder being indexed."""


@dataclass(frozen=True)
class Document:
    source: str   # path relative to the folder, with '/' separators
    text: str
    page_starts: tuple[int, ...] = ()   # PDF: the offset in `text` where each page begins


@dataclass(frozen=True)
class FileError:
    """A file left out of the build, and why."""
    source: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


class _HTMLText(HTMLParser):
    """Visible text of an HTML page: <title> first, blocks on their own lines, no script/style."""
    SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    BLOCKS = {"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "tr",
              "table", "section", "article", "blockquote", "dt", "dd", "hr"}
    CELLS = {"td", "th"}
    PRE = "\0pre\0"   # marks a verbatim line, whose whitespace html_to_text keeps

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title: list[str] = []
        self.parts: list[str] = []
        self._skip_depth = 0
        self._in_title = False
        self._pre_depth = 0
        self._cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skip_depth += 1
        if tag in self.BLOCKS:
            self.parts.append("\n")
        if tag == "pre":
            self._pre_depth += 1
        if tag in self.CELLS:
            if self._cell:
                self.parts.append(" | ")
            self._cell = True
        elif tag == "tr":
            self._cell = False

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP and self._skip_depth:
            self._skip_depth -= 1
        if tag == "pre" and self._pre_depth:
            self._pre_depth -= 1
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title.append(data)
        elif not self._skip_depth:
            if self._pre_depth:
                data = "\n".join(self.PRE + line for line in data.split("\n"))
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    title = " ".join("".join(parser.title).split())
    lines = []
    for line in "".join(parser.parts).splitlines():
        if _HTMLText.PRE in line:   # code: indentation and spacing kept
            line = line.replace(_HTMLText.PRE, "").rstrip()
            lines.append(line) if line.strip() else None
        elif line.split():
            lines.append(" ".join(line.split()))
    body = "\n".join(lines)
    return f"{title}\n{body}" if title and not body.startswith(title) else body


def pdf_to_text(data: bytes) -> tuple[str, tuple[int, ...]]:
    """A PDF's text, page after page, and where each page starts; DocumentError when it has none."""
    import io  # noqa: PLC0415

    from pypdf import PdfReader  # noqa: PLC0415
    from pypdf.errors import PyPdfError  # noqa: PLC0415

    from ragstack.chunking import normalize  # noqa: PLC0415

    logging.getLogger("pypdf").setLevel(logging.ERROR)   # its warnings on damaged files: the error says it
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError("an encrypted PDF; decrypt it first")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, OSError, RecursionError) as exc:
        raise DocumentError(f"cannot read the PDF ({type(exc).__name__}: {exc})") from None
    text, starts = "", []
    for page in pages:
        starts.append(len(text))
        text += normalize(page).rstrip() + "\n\n"
    if not text.strip():
        raise DocumentError(f"no text in its {len(pages)} page(s) (scanned images?); OCR it first")
    return text, tuple(starts)


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


def read_folder(folder: str | os.PathLike, errors: list[FileError] | None = None) -> list[Document]:
    """The folder's documents, sorted by path; whitespace-only documents are left out.

    With `errors`, a file that cannot be read is reported there and left out; without, it raises
    DocumentError. A link out of the folder raises UnsafePathError either way."""
    from ragstack.chunking import normalize  # noqa: PLC0415

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
            if name.startswith(".") or suffix not in SUFFIXES:
                continue
            source = path.relative_to(root).as_posix()
            if path.is_symlink():
                target = _check_link(path, root)   # outside: UnsafePathError, never a per-file error
            try:
                data = _read(target, path) if path.is_symlink() else _read(name, path, dir_fd)
                page_starts: tuple[int, ...] = ()
                if suffix in PDF_SUFFIXES:
                    text, page_starts = pdf_to_text(data)
                else:
                    text = data.decode("utf-8", errors="replace")
                    if suffix in HTML_SUFFIXES:
                        text = html_to_text(text)
            except DocumentError as exc:
                if errors is None:
                    if str(exc).startswith(str(path)):
                        raise
                    raise DocumentError(f"{path}: {exc}") from None
                errors.append(FileError(source, str(exc).removeprefix(f"{path} ").removeprefix(f"{path}: ")))
                continue
            if text.strip():
                documents.append(Document(source, normalize(text) if not page_starts else text, page_starts))
    return sorted(documents, key=lambda d: d.source)
