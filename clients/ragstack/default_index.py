"""The default retriever index, version 1, from data/sample_corpus (`ragstack build`, step default-index).

It starts the bundled Triton server with only the `embed` ensemble loaded (its tokenizer and
embedder come with it), on free ports, and runs the same `ragstack index build` code as a user
would against a running server. So the default index is embedded by exactly the served pipeline
(tokenizer settings, padding, the ONNX graph) and there is no second embedding code path to keep
in step; the cost is a server start of a few seconds.
"""
from __future__ import annotations

from ragstack import indexer
from ragstack.client import RagClient
from ragstack.launcher import ROOT, ServerOptions, TritonServer, free_ports

CORPUS = ROOT / "data" / "sample_corpus"


def build() -> indexer.BuildResult:
    """Write retriever version 1; raises LauncherError when the server cannot start."""
    http, grpc, metrics = free_ports(3)
    options = ServerOptions(models=["embed"], http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_s=10)
    with TritonServer(options) as server, RagClient(server.grpc_url) as client:
        # The step runs only when an input changed (the embedder too, which the fingerprint
        # cannot see): rebuild version 1 in place.
        result = indexer.build(CORPUS, client, version=1, force=True)
    print(f"[index] retriever version {result.version} written: {result.documents} documents, "
          f"{result.chunks} chunks in {result.path.relative_to(ROOT)}")
    return result
