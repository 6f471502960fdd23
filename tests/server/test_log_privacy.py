"""Prompts, queries and passages never reach the server log at info level (the level every
deployment runs at): requests carrying a unique marker go through every model that sees user
text, over gRPC and HTTP, served and refused; then the session server's log is searched for the
marker and for the passages the queries retrieved."""
from __future__ import annotations

import uuid

import pytest

from ragstack.client import RagClient, RagstackError

pytestmark = pytest.mark.server
MARK = f"privacy-{uuid.uuid4().hex}"


def exercise(client: RagClient) -> list[str]:
    """Every text-handling path once, with MARK in the text; returns the passages retrieved."""
    client.embed([f"{MARK} a sentence to embed"])
    client.rerank(f"{MARK} query", [f"{MARK} first passage", f"{MARK} second passage"])
    passages = [p.text for p in client.retrieve(f"{MARK} How is the KV cache divided into blocks?", top_k=2)]
    client.context(f"{MARK} What does the prompt builder do?", top_n=2)
    client.query(f"{MARK} How does paged attention work?", max_tokens=2).collect()
    client.generate(prompt=f"{MARK} a prompt", max_tokens=2).collect()
    client.generate(messages=[{"role": "user", "content": f"{MARK} a chat turn"}], max_tokens=2).collect()
    for bad in (lambda: client.generate(prompt=MARK, sampling_parameters={"temperature": -1}).collect(),
                lambda: client.generate(prompt=MARK * 4000).collect(),
                lambda: client.query(MARK, top_k=0).collect(),
                lambda: client.embed([MARK * 2000])):
        with pytest.raises(RagstackError):
            bad()
    return passages


def test_user_text_and_passages_stay_out_of_the_log(triton_server):
    passages = []
    for protocol, url in (("grpc", triton_server.grpc_url), ("http", triton_server.http_url)):
        with RagClient(url, protocol) as client:
            passages += exercise(client)
    log = triton_server.log_path.read_text(errors="replace")
    assert MARK not in log
    assert passages and not [p for p in passages if p[:80] in log]
