"""The official openai Node SDK (npm `openai` 7.55.0, with zod 4: tests/node_client, installed by `make setup`)
against the session server's frontend, its request flows unchanged (tests/node_client/flows.mjs): models,
chat whole, streamed and through its stream helper, rag's sources, `parse` with zod v4's string types (a
format and zod's own pattern each, validated by zod), strict tools through two turns, embeddings in its
default base64, its error classes with the request id, and an abort mid-stream, which frees the llm."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from server_metrics import wait_for_metric

pytestmark = pytest.mark.server
FLOWS = Path(__file__).resolve().parents[1] / "node_client" / "flows.mjs"


@pytest.fixture(scope="module")
def facts(triton_server):
    done = subprocess.run(["node", str(FLOWS), triton_server.openai_url], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_chat_whole_streamed_and_through_the_stream_helper(facts):
    assert {"llm", "rag", "embed"} <= set(facts["models"])
    assert facts["whole"]["text"] and facts["whole"]["text"] == facts["streamed"]["text"] == facts["helper"]
    assert facts["whole"]["usage"] == facts["streamed"]["usage"] and facts["whole"]["usage"]["completion_tokens"] == 6
    assert len(facts["whole"]["requestID"]) == 32


def test_rag_sources_reach_the_node_client(facts):
    assert facts["ragSources"] and facts["ragSources"][0].endswith(".md")


def test_zod_v4_formats_parse(facts):
    """zod parsed the answer: its own patterns held (a format beside them was refused before review 15)."""
    assert set(facts["parsed"]) == {"at", "day", "time", "id", "host"}


def test_strict_zod_tools_through_two_turns(facts):
    assert facts["toolCalls"] and all(call["name"] == "book" and set(call["parsed"]) == {"id", "day"}
                                      for call in facts["toolCalls"])
    assert facts["afterTools"] in ("stop", "length")


def test_embeddings_in_the_sdks_default_base64_are_the_floats(facts):
    assert facts["embeddings"] == {"dims": 384, "maxDifference": 0}


def test_errors_are_the_sdks_classes_with_their_fields(facts):
    assert facts["notFound"]["kind"] == "NotFoundError" and facts["notFound"]["code"] == "model_not_found"
    assert (facts["badRequest"]["kind"], facts["badRequest"]["status"], facts["badRequest"]["param"]) == (
        "BadRequestError", 400, "temperature")
    assert all(len(facts[k]["requestID"]) == 32 for k in ("notFound", "badRequest"))


def test_an_abort_mid_stream_frees_the_llm(facts, triton_server):
    assert facts["abortedAfter"] == 3
    for gauge in ("triton_llm_num_requests_running", "triton_llm_kv_cache_blocks_used"):
        wait_for_metric(triton_server.metrics_url, gauge, "llm", lambda v: v == 0, timeout_s=5)
