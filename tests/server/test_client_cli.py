"""The CLI's client subcommands on the real server: output, and exit codes 0 (ok), 1 (server or
request error), 2 (usage error) with messages on stderr."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ragstack.cli import main
from ragstack.client import RagClient
from ragstack.launcher import ROOT, free_port
from model_states import wait_until_settled

pytestmark = pytest.mark.server


@pytest.fixture(params=["grpc", "http"])
def connection(request, triton_server):
    url = triton_server.grpc_url if request.param == "grpc" else triton_server.http_url
    return ["--url", url, "--protocol", request.param]


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_embed(capsys, connection):
    code, out, err = run(capsys, "embed", "paged attention", "dynamic batching", *connection)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["text"] for line in lines] == ["paged attention", "dynamic batching"]
    assert all(len(line["embedding"]) == 384 and line["truncated"] is False for line in lines)


def test_rerank(capsys, connection):
    code, out, err = run(capsys, "rerank", "How are KV cache blocks allocated?", "Bananas are yellow.",
                         "The KV cache is split into blocks allocated on demand.", *connection)
    assert code == 0, err
    rows = [line.split("\t") for line in out.splitlines()]
    assert [r[1] for r in rows] == ["1", "0"]                       # best first, with its position
    assert float(rows[0][0]) > float(rows[1][0])


def test_models_list_unload_load_reload(capsys, connection):
    code, out, _ = run(capsys, "models", "list", *connection)
    assert code == 0 and any(line.split()[:3] == ["retriever", "1", "READY"] for line in out.splitlines())
    try:
        assert run(capsys, "models", "unload", "echo", *connection)[:2] == (0, "unloaded echo\n")
        out = run(capsys, "models", "list", *connection)[1]
        assert any(line.startswith("echo ") and "READY" not in line for line in out.splitlines())
    finally:
        assert run(capsys, "models", "load", "echo", *connection)[:2] == (0, "loaded echo\n")
    code, out, _ = run(capsys, "models", "reload", "retriever", "--version", "1", *connection)
    assert (code, out) == (0, "loaded retriever version 1\n")
    assert run(capsys, "models", "reload", "retriever", *connection)[0] == 0   # back to config.pbtxt's policy
    with RagClient(connection[1], connection[3]) as client:
        wait_until_settled(client, "retriever")
        wait_until_settled(client, "echo")


def test_models_errors(capsys, connection):
    code, _, err = run(capsys, "models", "load", "no_such_model", *connection)
    assert code == 1 and "ragstack models: error:" in err and "no_such_model" in err
    code, _, err = run(capsys, "models", "load", "retriever", "--version", "99", *connection)
    assert code == 1 and "at least one version must be available" in err
    assert run(capsys, "models", "list", *connection)[0] == 0            # the failed load changed nothing
    code, _, err = run(capsys, "models", "load", *connection)
    assert code == 2 and "name the model" in err
    code, _, err = run(capsys, "models", "unload", "echo", "--version", "1", *connection)
    assert code == 2 and "--version applies to load and reload only" in err
    assert run(capsys, "models", "frobnicate", *connection)[0] == 2


def test_request_errors_exit_1(capsys, connection):
    code, _, err = run(capsys, "query", "--context", "paged attention", "--top-k", "0", *connection)
    assert code == 1 and "top_k: 0 is out of range; it must be 1 to 64" in err
    # an ensemble step's error in a stream: Triton drops its code (gRPC) or answers 400 (HTTP generate)
    code, _, err = run(capsys, "query", "paged attention", "--sampling", '{"temperature": -1}', *connection)
    assert (code, err) == (1, "ragstack query: error: [INVALID_ARG] in ensemble 'rag', temperature must be >= 0 "
                              "(0 = greedy), got -1\n")
    code, _, err = run(capsys, "embed", "x", "--url", f"127.0.0.1:{free_port()}", "--protocol", connection[3])
    assert code == 1 and "[UNAVAILABLE] nothing listens at" in err   # tests/server/test_client_connection_errors.py


def test_query_context(capsys, connection):
    code, out, err = run(capsys, "query", "--context", "How is the KV cache divided into blocks?",
                         "--top-n", "2", *connection)
    assert code == 0, err
    assert "--- system" in out and "--- user" in out
    sources = out.split("\nSources:\n")[1]                              # a line per document
    assert sources.startswith("  [1") and "] paged_attention.md  lines " in sources.splitlines()[0]
    assert "2" in sources and "3]" not in sources and ", 3" not in sources


def test_query_streams_an_answer_then_sources(capsys, connection):
    code, out, err = run(capsys, "query", "What is paged attention?", "--max-tokens", "4",
                         "--sampling", '{"temperature": 0}', *connection)
    assert code == 0, err
    answer, sources = out.split("\nSources:\n")
    assert answer.strip() and sources.startswith("  [1")
    code, _, err = run(capsys, "query", "x", "--sampling", "{not json", *connection)
    assert code == 2 and "--sampling is not JSON" in err


def test_index_list_and_build(capsys, connection, tmp_path):
    code, out, _ = run(capsys, "index", "list")
    assert code == 0 and out.split()[0] == "1" and "sample_corpus" in out
    corpus, model_dir = tmp_path / "docs", tmp_path / "retriever"
    corpus.mkdir()
    (corpus / "a.md").write_text("Paged attention stores the KV cache in blocks.")
    build = ["index", "build", str(corpus), "--model-dir", str(model_dir), *connection]
    code, out, err = run(capsys, *build)
    assert code == 0 and out.startswith("wrote version 1: 1 documents, 1 chunks"), err
    code, out, _ = run(capsys, *build)
    assert code == 0 and out.startswith("unchanged: version 1 already indexes these 1 documents\nchunks: 1 of 192 ")
    assert "limit 256: none over" in out and "embedding:" not in out
    assert run(capsys, "index", "list", "--model-dir", str(model_dir))[1].split()[:1] == ["1"]


def test_index_build_usage_errors(capsys, connection, tmp_path):
    code, _, err = run(capsys, "index", "build", str(tmp_path / "missing"), *connection)
    assert code == 2 and "is not a folder" in err
    (tmp_path / "docs").mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "docs" / "escape.md").symlink_to(tmp_path / "secret.txt")
    code, _, err = run(capsys, "index", "build", str(tmp_path / "docs"), "--model-dir", str(tmp_path / "r"),
                       *connection)
    assert code == 2 and "escape.md is a symlink to" in err and "outside" in err
    code, _, err = run(capsys, "index", "build", str(tmp_path / "docs"), "--overlap-words", "500", *connection)
    assert code == 2
    assert not (tmp_path / "r").exists()


def test_exit_codes_of_the_real_process(triton_server):
    """The installed entry point, as a script sees it: status and stderr."""
    env = {**os.environ, "RAGSTACK_URL": triton_server.grpc_url}
    cli = [sys.executable, "-m", "ragstack.cli"]
    ok = subprocess.run([*cli, "models", "list"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "rag " in ok.stdout
    bad = subprocess.run([*cli, "rerank", "q", *["p"] * 65], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "INVALID_ARG" in bad.stderr and bad.stdout == ""
    usage = subprocess.run([*cli, "embed"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_a_reader_that_closes_early_ends_it_quietly(triton_server):
    """`ragstack embed ... | head -1`: the reader takes one line and closes the pipe while the CLI still
    writes (32 long texts: far more than a pipe holds); the CLI stops as Unix tools do, with 141
    (128 + SIGPIPE) and nothing on stderr, no BrokenPipeError traceback."""
    texts = [f"text {i} " + "paged attention " * 200 for i in range(32)]
    cli = subprocess.Popen([sys.executable, "-m", "ragstack.cli", "embed", *texts, "--url", triton_server.grpc_url],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = json.loads(cli.stdout.readline())
    cli.stdout.close()
    err = cli.stderr.read().decode()
    assert cli.wait(timeout=60) == 141 and err == "", err
    assert first["text"] == texts[0] and len(first["embedding"]) == 384
