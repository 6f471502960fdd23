"""`ragstack eval`: retrieval quality of the served pipeline on labeled queries, at three stages.

    retrieval   the retriever's ranking (top_k, --top-k): dense, and hybrid where the index has BM25
    rerank      those passages ordered by the rag pipeline's rerank step (model rag_rerank: the retriever's
                scores under the default pair-cosine reranker, a cross-encoder's when one is served)
    context     the passages rag_context puts in the llm's prompt, in their order (the served defaults:
                top_k, top_n, the llm's token budget), and whether that order is the reranked order

Relevance is per document: a passage is relevant when its source is one of the query's relevant
documents, and each relevant document counts once, at its first passage (so ten passages of one document
are not ten hits). With hits at 1-based positions i (within the first k passages) and R relevant documents:
MRR@10 = 1/i of the first hit; recall@k = relevant documents among the first k passages / R;
nDCG@10 = sum 1/log2(i + 1) over hits, divided by its best value, sum over j <= min(R, 10) of 1/log2(j + 1).
Figures are means over the queries. With --answers each query is also asked of `rag` at its defaults, and
its failures are counted (a prompt-length error would be one).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ragstack.eval_sets import LabeledQuery

CUTOFFS = (1, 5, 10)
STAGES = ("retrieval", "rerank", "context")


def hits(ranked_sources: list[str], relevant: frozenset[str], k: int) -> list[int]:
    """1-based positions, within the first k, of each relevant document's first passage."""
    seen, found = set(), []
    for i, source in enumerate(ranked_sources[:k], 1):
        if source in relevant and source not in seen:
            seen.add(source)
            found.append(i)
    return found


def scores(ranked_sources: list[str], relevant: frozenset[str]) -> dict[str, float]:
    """MRR@10, recall@1/5/10 and nDCG@10 of one ranking."""
    top = hits(ranked_sources, relevant, 10)
    ideal = sum(1 / math.log2(j + 1) for j in range(1, min(len(relevant), 10) + 1))
    result = {"MRR@10": 1 / top[0] if top else 0.0}
    for k in CUTOFFS:
        result[f"recall@{k}"] = len(hits(ranked_sources, relevant, k)) / len(relevant)
    result["nDCG@10"] = sum(1 / math.log2(i + 1) for i in top) / ideal
    return result


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]} if rows else {}


@dataclass
class Evaluation:
    queries: int = 0
    stages: dict[str, dict[str, float]] = field(default_factory=dict)   # stage -> metric -> mean
    context_passages: float = 0.0          # passages in the prompt, mean
    context_in_reranked_order: int = 0     # queries whose context is the reranked order's head
    answers_ok: int | None = None          # with --answers: rag queries answered without an error
    answer_errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)             # per query, by stage

    def table(self) -> list[dict]:
        return [{"stage": stage, **{k: round(v, 3) for k, v in figures.items()}}
                for stage, figures in self.stages.items()]


def served_default_top_k(client) -> int:
    try:
        return int(client.model_config("retriever")["parameters"]["default_top_k"]["string_value"])
    except Exception:  # noqa: BLE001 - the shipped default
        return 8


def evaluate(client, queries: list[LabeledQuery], top_k: int = 10, modes: tuple[str, ...] = ("dense", "hybrid"),
             context_top_k: int | None = None, top_n: int | None = None, answers: bool = False,
             version: str = "") -> Evaluation:
    """Evaluate the served pipeline (a RagClient) on `queries`. `modes`: the retrieval modes to measure
    (the index's own default is measured again as `retrieval`, the stage rerank and context follow)."""
    result = Evaluation(queries=len(queries))
    per: dict[str, list[dict]] = {}
    timing: dict[str, float] = {}
    ctx_k = context_top_k or served_default_top_k(client)
    contexts = []
    for q in queries:
        for mode in modes:
            started = time.perf_counter()
            ranked = client.retrieve(q.query, top_k=top_k, version=version, mode=mode)
            timing[f"retrieval ({mode})"] = timing.get(f"retrieval ({mode})", 0.0) + time.perf_counter() - started
            per.setdefault(f"retrieval ({mode})", []).append(scores([p.source for p in ranked], q.relevant))
        started = time.perf_counter()
        retrieved = client.retrieve(q.query, top_k=max(top_k, ctx_k), version=version)
        timing["retrieval"] = timing.get("retrieval", 0.0) + time.perf_counter() - started
        per.setdefault("retrieval", []).append(scores([p.source for p in retrieved[:top_k]], q.relevant))
        started = time.perf_counter()
        rerank_scores = client.rag_rerank(q.query, retrieved[:top_k])
        timing["rerank"] = timing.get("rerank", 0.0) + time.perf_counter() - started
        order = sorted(range(len(rerank_scores)), key=lambda i: -rerank_scores[i])   # stable: ties keep their rank
        per.setdefault("rerank", []).append(scores([retrieved[i].source for i in order], q.relevant))
        started = time.perf_counter()
        context = client.context(q.query, top_k=context_top_k, top_n=top_n)
        timing["context"] = timing.get("context", 0.0) + time.perf_counter() - started
        per.setdefault("context", []).append(scores([s.source for s in context.sources], q.relevant))
        contexts.append(len(context.sources))
        # the context's order must be the reranked order of the passages it was chosen from
        candidates = retrieved[:ctx_k]
        ctx_scores = client.rag_rerank(q.query, candidates) if ctx_k > top_k else \
            [rerank_scores[i] for i in range(len(candidates))]
        expected = [candidates[i].id for i in sorted(range(len(candidates)), key=lambda i: -ctx_scores[i])]
        got = [s.passage_id for s in context.sources]
        result.context_in_reranked_order += got == expected[:len(got)]
        if answers:
            try:
                answer = client.query(q.query, stream=False).collect()
                result.answers_ok = (result.answers_ok or 0) + bool(answer.finish_reason)
            except Exception as exc:  # noqa: BLE001 - counted and reported, the evaluation goes on
                result.answers_ok = result.answers_ok or 0
                result.answer_errors.append(f"{q.id}: {exc}")
    result.stages = {stage: mean(rows) for stage, rows in per.items()}
    result.context_passages = sum(contexts) / len(contexts) if contexts else 0.0
    result.seconds = {stage: total / len(queries) for stage, total in timing.items()} if queries else {}
    return result
