"""`ragstack query "QUESTION"`: the rag ensemble's answer as it streams, then its sources.
With --context, the prompt the llm would get (the rag_context ensemble), without generating."""
from __future__ import annotations

import argparse
import json
import sys

from ragstack.cli_common import EXIT_OK, UsageError, add_connection_arguments, connect, run_reporting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question")
    parser.add_argument("--top-k", type=int, help="passages to retrieve (1-64; default 8)")
    parser.add_argument("--top-n", type=int, help="reranked passages in the prompt (1-16; default 4)")
    parser.add_argument("--max-tokens", type=int, help="longest answer, in tokens")
    parser.add_argument("--sampling", metavar="JSON", help='sampling parameters, e.g. \'{"temperature": 0}\'')
    parser.add_argument("--answer-format", choices=["text", "json"],
                        help='json: {"answer": ..., "citations": [source numbers]}, schema-constrained')
    parser.add_argument("--max-answer-chars", type=int, help="with --answer-format json: the answer's longest")
    parser.add_argument("--no-stream", action="store_true", help="one response instead of a stream")
    parser.add_argument("--context", action="store_true", help="print the messages and sources only")
    add_connection_arguments(parser)


def _print_sources(sources) -> None:
    """One line per document: the citation numbers of its passages, where they are, its best score."""
    from ragstack.results import documents_of  # noqa: PLC0415

    print("\nSources:")
    for doc in documents_of(sources):
        where = f"  {doc.spans()}" if doc.spans() else ""
        print(f"  [{', '.join(str(n) for n in doc.citations)}] {doc.source}{where}  (score {doc.score:.3f})")


def run(args: argparse.Namespace) -> int:
    def body() -> int:
        try:
            sampling = json.loads(args.sampling) if args.sampling else None
        except json.JSONDecodeError as exc:
            raise UsageError(f"--sampling is not JSON: {exc}") from None
        with connect(args) as client:
            if args.context:
                context = client.context(args.question, args.top_k, args.top_n)
                for message in context.messages:
                    print(f"--- {message['role']}\n{message['content']}")
                _print_sources(context.sources)
                return EXIT_OK
            stream = client.query(args.question, args.top_k, args.top_n, sampling, args.max_tokens,
                                  stream=not args.no_stream, answer_format=args.answer_format,
                                  max_answer_chars=args.max_answer_chars)
            for delta in stream:
                sys.stdout.write(delta)
                sys.stdout.flush()
            print()
            _print_sources(stream.answer.sources)
        return EXIT_OK
    return run_reporting("query", body)
