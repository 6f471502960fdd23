"""benchmarks/bench_rag_gpu.py's set-up from built artifacts, without a server: the repository it writes
around the unpacked version folders (the built versions served, on the CPU, the tokenizers reading them,
code versions linked to the checkout, the llm's engine.json and its gpu config), and the chat template it
gives a checkpoint whose tokenizer has none. The whole path (pack, serve, measure) runs on the CPU with
`MODE=cpu CARRY_VENV=.venv bash benchmarks/gpu_rag.sh`."""
from __future__ import annotations

import json
import re

from benchmarks.bench_rag_gpu import ROOT, chat_checkpoint, write_repository


def _built(repo, name, version):
    folder = repo / name / str(version)
    folder.mkdir(parents=True)
    (folder / "export.json").write_text("{}")


def test_the_repository_serves_the_built_versions_on_the_cpu(tmp_path):
    repo = tmp_path / "repository"
    for name, version in (("embedder", 2), ("reranker", 2), ("retriever", 1)):
        _built(repo, name, version)
    llm = tmp_path / "l8b"
    built = write_repository(repo, llm, {"max_model_len": 4096, "enable_prefix_caching": False})

    assert built == {"embedder": ["2"], "reranker": ["2"], "retriever": ["1"]}
    embedder = (repo / "embedder" / "config.pbtxt").read_text()
    assert re.search(r"versions: \[ 2 \]", embedder) and "kind: KIND_AUTO" not in embedder and "kind: KIND_CPU" in embedder
    assert "kind: KIND_AUTO" not in (repo / "reranker" / "config.pbtxt").read_text()
    assert '"embedder/2"' in (repo / "embed_tokenizer" / "config.pbtxt").read_text()
    assert '"reranker/2"' in (repo / "rerank_tokenizer" / "config.pbtxt").read_text()
    assert (repo / "embed_tokenizer" / "1").is_dir()
    # code versions are links, so prompt_builder finds backends/triton_llm through its resolved path
    link = repo / "prompt_builder" / "1" / "model.py"
    assert link.is_symlink() and link.resolve() == ROOT / "model_repository" / "prompt_builder" / "1" / "model.py"
    assert (repo / "rag_generate" / "1" / "structured_answer.py").is_symlink()
    assert json.loads((repo / "llm" / "1" / "engine.json").read_text()) == {
        "model": str(llm.resolve()), "max_model_len": 4096, "enable_prefix_caching": False}
    assert (repo / "llm" / "configs" / "gpu.pbtxt").is_file()
    # the built folders are left as they were
    assert (repo / "embedder" / "2" / "export.json").read_text() == "{}"


def test_without_a_retriever_or_llm_only_the_rest_is_written(tmp_path):
    repo = tmp_path / "repository"
    _built(repo, "embedder", 2)
    built = write_repository(repo)
    assert built["retriever"] == [] and not (repo / "retriever").exists() and not (repo / "llm").exists()
    assert '"embedder/2"' in (repo / "embed_tokenizer" / "config.pbtxt").read_text()


def test_a_tokenizer_without_chat_template_gets_one_in_a_linked_copy(tmp_path):
    base = tmp_path / "l8b"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    chat = chat_checkpoint(base, tmp_path / "work")
    assert chat != base and (chat / "config.json").is_symlink()
    config = json.loads((chat / "tokenizer_config.json").read_text())
    assert config["chat_template"] and config["eos_token"] == "</s>"
    assert "chat_template" not in json.loads((base / "tokenizer_config.json").read_text())
    assert chat_checkpoint(chat, tmp_path / "again") == chat   # one with a template is used as it is
