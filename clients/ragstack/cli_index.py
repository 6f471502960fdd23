"""`ragstack index build FOLDER [--load]` and `ragstack index list`: retriever index versions.

build chunks in the embedder's tokens, embeds the new chunks through the running server's `embed`
model (the rest come from the previous version) and writes version N+1 into the retriever's model
folder (nothing when the documents are unchanged), then prints its report: chunk lengths against the
embedder's limit, lines cut, files that could not be read, chunks/s. --load then loads it, which
switches traffic to it and unloads the old version (version_policy latest 1).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragstack.cli_common import EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ragstack import indexer  # noqa: PLC0415
    from ragstack.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS  # noqa: PLC0415

    sub = parser.add_subparsers(dest="index_action", required=True)
    build = sub.add_parser("build", help="index a folder of .txt/.md/.html/.pdf documents as a new version")
    build.add_argument("folder", type=Path)
    build.add_argument("--load", action="store_true", help="load the new version on the server")
    build.add_argument("--force", action="store_true",
                       help="write a new version even if nothing changed, embedding every chunk again")
    build.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS,
                       help="embedder tokens per chunk at most, special tokens included (at most its limit, 256)")
    build.add_argument("--overlap-tokens", type=int, default=DEFAULT_OVERLAP_TOKENS,
                       help="tokens consecutive chunks share, at most half a chunk")
    build.add_argument("--retrieval", choices=["dense", "hybrid"], default=indexer.DEFAULT_RETRIEVAL,
                       help="the index's retrieval: dense (FAISS cosine) or hybrid (dense + BM25, reciprocal "
                            "rank fusion); default %(default)s, the better on the project's evaluation set")
    build.add_argument("--tokenizer", type=Path,
                       help="the embedder's tokenizer.json (default: the served embed_tokenizer's, in this checkout)")
    build.add_argument("--index-type", choices=["auto", "flat", "hnsw"], default="auto",
                       help="auto: exact flat below 50,000 chunks, HNSW from there")
    build.add_argument("--model", default="retriever", help="the retriever model to load (with --load)")
    build.add_argument("--model-dir", type=Path, default=indexer.DEFAULT_MODEL_DIR,
                       help="the retriever's model folder (default model_repository/retriever)")
    add_connection_arguments(build)
    build.add_argument("--server", dest="url", help="same as --url")
    listing = sub.add_parser("list", help="the index versions in the retriever's model folder")
    listing.add_argument("--model-dir", type=Path, default=indexer.DEFAULT_MODEL_DIR)


def _build(args: argparse.Namespace) -> int:
    from ragstack import indexer  # noqa: PLC0415
    from ragstack.documents import DocumentError  # noqa: PLC0415

    with connect(args) as client:
        try:
            result = indexer.build(args.folder, client, args.model_dir, chunk_tokens=args.chunk_tokens,
                                   overlap_tokens=args.overlap_tokens, force=args.force, index_type=args.index_type,
                                   tokenizer=args.tokenizer, retrieval=args.retrieval)
        except (DocumentError, ValueError) as exc:
            raise UsageError(str(exc)) from None
        if result.created:
            print(f"wrote version {result.version}: {result.documents} documents, {result.chunks} chunks "
                  f"in {result.path}")
        else:
            print(f"unchanged: version {result.version} already indexes these {result.documents} documents")
        report = result.report if result.created else {k: v for k, v in result.report.items() if k != "embedded"}
        for line in indexer.describe(report):   # unchanged: the chunks it holds, not its past embedding
            print(line)
        for error in result.errors:
            print(f"error: {error} (left out)", file=sys.stderr)
        if args.load:
            client.load(args.model)
            print(f"loaded {args.model}: version {result.version} serves")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    from ragstack import index_store  # noqa: PLC0415

    found = index_store.versions(args.model_dir)
    if not found:
        print(f"no index versions in {args.model_dir}")
    for version in found:
        m = index_store.read_manifest(args.model_dir, version).manifest
        print(f"{version:>4}  {m['created']}  {m['documents']:>5} documents  {m['count']:>7} chunks  "
              f"{m['index_type']:<5} {m.get('retrieval', 'dense'):<6} {m['folder']}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    return run_reporting(f"index {args.index_action}", lambda: (_build if args.index_action == "build" else _list)(args))
