"""Evaluation sets: a corpus of public text that ships with an installed package, and queries labeled
with the documents that answer them (data/eval/<set>/queries.jsonl), written before any retrieval
result was seen.

`python_reference`: the 79 sections of the Python Language and Library Reference that CPython ships in
`pydoc_data/topics.py` for `help()` (Python 3.11: 465 KB of prose, grammar, tables and code). The text is
the Python Software Foundation's documentation, under the PSF License Agreement version 2 (copying and
redistribution allowed with the notice kept; examples also under the Zero-Clause BSD licence): no copy is
kept in this repository, the corpus is written from the installed Python when needed. One file per
section: `<topic>.txt`.

Labels: each query names the sections that answer it. Some sections hold others verbatim ("compound"
holds "for", "while", "try", ...; "specialnames" holds "customization", "attribute-access", ...): a
section that contains a labeled one is relevant too (`expand_labels`, from the texts alone).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ragstack.launcher import ROOT

SETS_DIR = ROOT / "data" / "eval"


@dataclass(frozen=True)
class LabeledQuery:
    id: str
    query: str
    relevant: frozenset[str]      # document paths (relative to the corpus folder)


def corpus_texts(name: str) -> dict[str, str]:
    """The set's documents: path -> text."""
    if name != "python_reference":
        raise ValueError(f"evaluation set {name!r}: known sets are ['python_reference']")
    import pydoc_data.topics  # noqa: PLC0415 - CPython's own

    return {f"{topic}.txt": text for topic, text in sorted(pydoc_data.topics.topics.items())}


def provenance(name: str) -> dict:
    return {"set": name, "source": "CPython's pydoc_data/topics.py (the Python reference's sections for help())",
            "python": sys.version.split()[0], "license": "PSF License Agreement v2 (examples also 0BSD)"}


def write_corpus(name: str, folder: str | Path) -> Path:
    """Write the set's documents into `folder` (created); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in corpus_texts(name).items():
        (folder / path).write_text(text, encoding="utf-8")
    return folder


def containers(texts: dict[str, str], fragment_chars: int = 150) -> dict[str, set[str]]:
    """Document -> the other documents that contain its text (a fragment from its middle, verbatim)."""
    held: dict[str, set[str]] = {}
    for a, text in texts.items():
        body = text.strip()
        middle = body[len(body) // 2: len(body) // 2 + fragment_chars]
        held[a] = {b for b, other in texts.items() if b != a and middle and middle in other}
    return held


def expand_labels(relevant: set[str], texts: dict[str, str]) -> frozenset[str]:
    """The labeled documents and every document that holds one of them verbatim."""
    held = containers(texts)
    return frozenset(relevant | {c for r in relevant for c in held.get(r, ())})


def read_queries(path: str | Path, texts: dict[str, str] | None = None) -> list[LabeledQuery]:
    """A JSON-lines file of {"id", "query", "relevant": [paths]}; with the corpus `texts`, labels expanded."""
    queries = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            relevant = set(row["relevant"])
            query = LabeledQuery(str(row.get("id", number)), str(row["query"]), frozenset(relevant))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: a line must be {{\"id\", \"query\", \"relevant\": [document paths]}} "
                             f"({type(exc).__name__}: {exc})") from None
        if not relevant:
            raise ValueError(f"{path}:{number}: no relevant document")
        if texts is not None:
            unknown = sorted(relevant - set(texts))
            if unknown:
                raise ValueError(f"{path}:{number}: {unknown} are not documents of the corpus")
            query = LabeledQuery(query.id, query.query, expand_labels(relevant, texts))
        queries.append(query)
    return queries


def queries_path(name: str) -> Path:
    return SETS_DIR / name / "queries.jsonl"


def main(argv: list[str] | None = None) -> int:
    """python -m ragstack.eval_sets SET FOLDER: write the set's corpus into FOLDER."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m ragstack.eval_sets SET FOLDER", file=sys.stderr)
        return 2
    folder = write_corpus(args[0], args[1])
    print(f"wrote {len(corpus_texts(args[0]))} documents of {args[0]} to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
