"""Retrieval quality on the project's evaluation set (issue 26): `ragstack eval` over the served pipeline
for a dense index, the same index hybrid (BM25 fused with dense by reciprocal rank), and a cross-encoder in
the reranker slot, with what each costs on this machine.

The set is `python_reference` (ragstack/eval_sets.py): the 79 sections of the Python reference that
CPython ships for help() (PSF License v2), 80 queries written before any result was seen, labeled with the
sections that answer them. The script writes the corpus, starts the bundled server on free ports over a
scratch model repository (the project's models linked, its own `retriever` and `reranker` folders), builds
the corpus's index as a dense version and again as a hybrid one (which embeds nothing: every chunk id is
the dense version's), evaluates each at retrieval, rerank and final context, asks `rag` every query at its
defaults (no prompt-length error allowed), then exports the exporter's tiny random cross-encoder (the test
suite's, a BertForSequenceClassification of 2 layers, hidden 32) as reranker version 2 and evaluates again.
The cross-encoder's cost is timed through the `rerank` ensemble for 1 to 64 candidates: per query (a call
with one candidate) and per candidate (what each further one adds, up to 64).

Rows: one per configuration and stage: MRR@10, recall@1/5/10, nDCG@10 (per document: ragstack/evaluate.py),
ms per query of that stage through the client.

    python -m benchmarks.bench_retrieval [--chunk-tokens 192 --overlap-tokens 32] [--no-cross-encoder]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ragstack import eval_sets, evaluate, indexer
from ragstack.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS
from ragstack.client import RagClient
from ragstack.launcher import ROOT, ServerOptions, TritonServer, free_port
from ragstack.tiny_checkpoints import write_tiny_cross_encoder

from benchmarks import record
from benchmarks.provenance import machine
from benchmarks.table import markdown, rounded

OWN = ("retriever", "reranker")   # folders of the scratch repository that are its own, not links


def scratch_repository(folder: Path) -> Path:
    """The project's model repository with links for every model but the retriever and the reranker, which
    get folders of their own (the project's config; version 1 of each, so that the server starts)."""
    repo = folder / "model_repository"
    repo.mkdir(parents=True)
    for model in sorted((ROOT / "model_repository").iterdir()):
        if not model.is_dir():
            continue
        if model.name in OWN:
            (repo / model.name).mkdir()
            shutil.copy(model / "config.pbtxt", repo / model.name / "config.pbtxt")
            (repo / model.name / "1").symlink_to(model / "1", target_is_directory=True)
        else:
            (repo / model.name).symlink_to(model, target_is_directory=True)
    return repo


def rerank_cost(client: RagClient, queries: list[str], sizes=(1, 8, 16, 32, 64), repeats: int = 3) -> dict:
    """Median ms of one `rerank` call per candidate count; per query: one candidate's call, per candidate:
    what each further one adds, up to the most."""
    passages = [p.text for p in client.retrieve(queries[0], top_k=max(sizes))]
    medians = {}
    for n in sizes:
        times = []
        for _ in range(repeats):
            for q in queries:
                started = time.perf_counter()
                client.rerank(q, passages[:n])
                times.append((time.perf_counter() - started) * 1000)
        medians[n] = statistics.median(times)
    most = max(sizes)
    return {"ms": medians, "per_query_ms": medians[1], "per_candidate_ms": (medians[most] - medians[1]) / (most - 1)}


def rows_of(config: str, result: evaluate.Evaluation) -> list[dict]:
    timing = {"rerank": "rerank", "context": "context"}
    rows = []
    for stage, figures in result.stages.items():
        if stage == "retrieval":
            continue   # the same as the index's own mode, shown under its name
        rows.append({"configuration": config, "stage": stage, **{k: rounded(v, 3) for k, v in figures.items()},
                     "ms/query": rounded(result.seconds.get(timing.get(stage, stage), float("nan")) * 1000, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="eval_set", default="python_reference")
    parser.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS)
    parser.add_argument("--overlap-tokens", type=int, default=DEFAULT_OVERLAP_TOKENS)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--no-cross-encoder", dest="cross_encoder", action="store_false")
    record.add_argument(parser, "retrieval")
    args = parser.parse_args(argv)

    texts = eval_sets.corpus_texts(args.eval_set)
    queries = eval_sets.read_queries(eval_sets.queries_path(args.eval_set), texts)
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as tmp:
        tmp = Path(tmp)
        corpus = eval_sets.write_corpus(args.eval_set, tmp / "corpus")
        repo = scratch_repository(tmp)
        retriever_dir = repo / "retriever"
        options = ServerOptions(model_repositories=[repo, ROOT / "ensembles"], http_port=free_port(),
                                grpc_port=free_port(), metrics_port=free_port())
        with TritonServer(options, work_dir=tmp / "server") as server, RagClient(server.grpc_url, timeout_s=600) as client:
            builds = {}
            for version, retrieval in ((2, "dense"), (3, "hybrid")):
                built = indexer.build(corpus, client, retriever_dir, version=version, retrieval=retrieval,
                                      chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap_tokens)
                builds[retrieval] = built.report
                client.load("retriever")          # latest 1: this version serves
                result = evaluate.evaluate(client, queries, args.top_k, ("dense", "hybrid"), answers=True)
                print(markdown(result.table()))
                rows += rows_of(f"{retrieval} index, pair-cosine reranker", result)
                notes.append(f"{retrieval} index (version {version}): context in the reranked order for "
                             f"{result.context_in_reranked_order} of {result.queries} queries, "
                             f"{result.context_passages:.1f} passages on average; rag answered "
                             f"{result.answers_ok} of {result.queries} queries at its defaults"
                             + (f" (errors: {'; '.join(result.answer_errors[:3])})" if result.answer_errors else ""))
                if retrieval == "dense":
                    dense_result = result
            dense_report = builds["dense"]
            notes.insert(0, f"Corpus: {len(texts)} documents, {dense_report['chunks']} chunks of at most "
                            f"{args.chunk_tokens} embedder tokens (overlap {args.overlap_tokens}); tokens median "
                            f"{dense_report['tokens']['median']}, max {dense_report['tokens']['max']} of the limit "
                            f"{dense_report['limit']}: {dense_report['over_limit']} over, "
                            f"{dense_report['truncated_by_embedder']} truncated by the embedder, "
                            f"{dense_report['lines_cut']} lines cut; embedded at {dense_report['chunks_per_s']} chunks/s; "
                            f"the hybrid version embedded {builds['hybrid']['embedded']} and reused "
                            f"{builds['hybrid']['reused']}.")
            if args.cross_encoder:
                export_dir = write_tiny_cross_encoder(tmp / "tiny-cross-encoder")
                from ragstack.onnx_export import export

                export(export_dir, repo, "reranker", 2)
                client.load("retriever", version=2)   # the dense index
                client.load("reranker", version=2)
                result = evaluate.evaluate(client, queries, args.top_k, ("dense",), answers=False)
                print(markdown(result.table()))
                rows += [r for r in rows_of("dense index, tiny random cross-encoder", result)
                         if r["stage"] != "retrieval (dense)"]
                cost = rerank_cost(client, [q.query for q in queries[:8]])
                notes.append(f"Tiny cross-encoder (random weights, as in CI) in the reranker slot: rerank "
                             f"{', '.join(f'{n} candidates {ms:.1f} ms' for n, ms in cost['ms'].items())} "
                             f"(medians): {cost['per_query_ms']:.1f} ms per query + {cost['per_candidate_ms']:.2f} ms "
                             f"per candidate on this CPU; the default pair-cosine costs no encoder call (the "
                             f"retriever's scores). Its random scores reorder the context: context in the reranked "
                             f"order for {result.context_in_reranked_order} of {result.queries} queries.")
                dense_ctx = dense_result.stages["context"]["MRR@10"]
                notes.append(f"What the cross-encoder changes: context MRR@10 {dense_ctx:.3f} -> "
                             f"{result.stages['context']['MRR@10']:.3f} (a trained cross-encoder is the point of the "
                             f"slot; this one only proves the path and its cost).")
    retrievals = {r["stage"]: r for r in rows if r["stage"].startswith("retrieval (")}
    best = max(retrievals.values(), key=lambda r: (r["nDCG@10"], r["recall@10"], r["MRR@10"]))
    notes.append(f"Best retrieval by nDCG@10 (then recall@10): {best['stage']} ("
                 + "; ".join(f"{stage}: nDCG@10 {r['nDCG@10']}, recall@10 {r['recall@10']}, MRR@10 {r['MRR@10']}"
                             for stage, r in retrievals.items())
                 + f"); the index default (`ragstack index build --retrieval`) is {indexer.DEFAULT_RETRIEVAL}.")
    print(markdown(rows))
    for note in notes:
        print(note)
    if args.record:
        record.write(args.record, __file__, argv, args, machine(), rows, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
