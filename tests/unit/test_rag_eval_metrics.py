"""The retrieval metrics of `ragstack eval` (ragstack.evaluate) on hand-computed cases, the evaluation set's
labels (every one a document of the corpus, containers added) and the sources grouped per document."""
from __future__ import annotations

import json
import math

import pytest

from ragstack import eval_sets
from ragstack.evaluate import hits, mean, scores
from ragstack.results import Source, documents_of, parse_sources


def test_metrics_count_each_relevant_document_once():
    relevant = frozenset({"a", "b"})
    ranking = ["x", "a", "a", "y", "b"]             # a at 2 (and again at 3: not a second hit), b at 5
    assert hits(ranking, relevant, 10) == [2, 5] and hits(ranking, relevant, 4) == [2]
    s = scores(ranking, relevant)
    assert s["MRR@10"] == 0.5 and s["recall@1"] == 0 and s["recall@5"] == 1.0 and s["recall@10"] == 1.0
    ideal = 1 + 1 / math.log2(3)
    assert s["nDCG@10"] == pytest.approx((1 / math.log2(3) + 1 / math.log2(6)) / ideal)
    perfect = scores(["a", "b", "z"], relevant)
    assert perfect == {"MRR@10": 1.0, "recall@1": 0.5, "recall@5": 1.0, "recall@10": 1.0, "nDCG@10": 1.0}
    assert scores([], relevant)["MRR@10"] == 0 and scores(["q"] * 10 + ["a"], relevant)["recall@10"] == 0
    assert mean([{"m": 1.0}, {"m": 0.0}]) == {"m": 0.5}


def test_the_python_reference_set():
    texts = eval_sets.corpus_texts("python_reference")
    queries = eval_sets.read_queries(eval_sets.queries_path("python_reference"), texts)
    assert len(texts) > 70 and len(queries) >= 60 and len({q.id for q in queries}) == len(queries)
    by_id = {q.id: q for q in queries}
    # "for" is held verbatim by "compound": a query labeled with the one finds both relevant
    loop = next(q for q in queries if q.query.startswith("When does the else clause of a for loop run"))
    assert loop.relevant == {"for.txt", "compound.txt"}
    assert all(q.relevant <= set(texts) for q in by_id.values())


def test_bad_query_files(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"id": "1", "query": "q", "relevant": ["nope.txt"]}) + "\n")
    with pytest.raises(ValueError, match=r"\['nope.txt'\] are not documents of the corpus"):
        eval_sets.read_queries(path, {"a.txt": "x"})
    path.write_text('{"query": "q"}\n')
    with pytest.raises(ValueError, match="q.jsonl:1: a line must be"):
        eval_sets.read_queries(path)


def test_sources_per_document():
    raw = json.dumps([
        {"n": 1, "source": "a.md", "passage_id": "p1", "score": 0.9, "chunk": 3, "lines": [40, 60]},
        {"n": 2, "source": "b.pdf", "passage_id": "p2", "score": 0.8, "chunk": 0, "lines": [1, 9], "pages": [1, 1]},
        {"n": 3, "source": "a.md", "passage_id": "p3", "score": 0.7, "chunk": 2, "lines": [30, 41], "trimmed": True},
        {"n": 4, "source": "c.txt", "passage_id": "p4", "score": 0.1},   # an index without locations
    ])
    sources = parse_sources(raw)
    assert sources[2] == Source(3, "a.md", "p3", 0.7) and sources[2].trimmed and sources[0].lines == (40, 60)
    a, b, c = documents_of(sources)
    assert (a.source, a.score, a.citations, a.chunks) == ("a.md", 0.9, [1, 3], [2, 3])
    assert a.spans() == "lines 30-60" and b.spans() == "pages 1" and c.spans() == "" and c.citations == [4]
