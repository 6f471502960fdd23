"""Stand-ins shared by the engine tests: a byte-level tokenizer and a deterministic fake model.

The engine tests need only the engine's own dependencies (torch, triton, transformers, tokenizers,
safetensors, pytest, hypothesis), so `python -m pytest tests/engine` runs on a GPU machine where the
server's packages are not installed (README, "The engine on its own"). A module that needs a package
beyond those says so in OPTIONAL: where the package is missing, the module is left out and the run's
summary names it, instead of failing the collection.
"""
from __future__ import annotations

import importlib
import json
import os
import zlib
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    # Kernel tests run in Triton's CPU interpreter without a GPU. Read when a @triton.jit kernel
    # is defined, so it must be set before anything imports llm_engine.kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")

# test module -> packages beyond the engine's core that it needs (structured output: the grammar engine,
# and jsonschema to check its outputs).
OPTIONAL = {"test_structured_output.py": ("xgrammar", "jsonschema")}
_LEFT_OUT: list[str] = []


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def pytest_ignore_collect(collection_path, config):
    missing = [m for m in OPTIONAL.get(collection_path.name, ()) if not _importable(m)]
    if missing:
        _LEFT_OUT.append(f"{collection_path.name}: {', '.join(missing)} not installed")
        return True
    return None


def pytest_terminal_summary(terminalreporter):
    for line in dict.fromkeys(_LEFT_OUT):
        terminalreporter.write_line(f"left out {line}")


EOS = 256
_SPECIAL = {256: "</s>", 257: "<s>"}


class ByteTokenizer:
    """One token per UTF-8 byte, so multibyte characters really span tokens; 256 = eos."""

    eos_token_ids = (EOS,)
    vocab_size = 260
    cleans_up = False

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True, clean_up: bool = True) -> str:
        parts = []
        for i in ids:
            if i < 256:
                parts.append(bytes([i]))
            elif not skip_special_tokens:
                parts.append(_SPECIAL.get(i, "<?>").encode())
        return b"".join(parts).decode("utf-8", errors="replace")


class CountingRunner:
    """A ModelRunner stand-in whose "model" predicts the next byte: (last + 1) mod 256, and eos
    after "z". "a" continues "bcd...", "x" continues "yz" then ends.

    It checks the ScheduledBatch contract on every call and records each batch's shape. A
    sequence's last token may be a placeholder (async scheduling): it reads it from `sampled_ids`,
    the previous step's sampled ids, as the real runner does on the device.
    """

    def __init__(self, num_kv_blocks: int = 64, block_size: int = 4) -> None:
        self.tokenizer = ByteTokenizer()
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.batches: list[list[tuple[str, int, bool]]] = []
        self.fail_when = None  # callable(batch) -> bool: raise inside execute

    def execute(self, batch, sampled_ids=None):
        from llm_engine.core.sequence import placeholder_row

        if self.fail_when is not None and self.fail_when(batch):
            raise RuntimeError("injected model failure")
        self.batches.append([(s.request_id, n, smp) for s, n, smp in zip(batch.seqs, batch.num_new_tokens, batch.sample)])
        rows = []
        for seq, n, sample in zip(batch.seqs, batch.num_new_tokens, batch.sample):
            end = seq.num_computed_tokens + n
            assert len(seq.block_table) * self.block_size >= end, "block table does not cover the chunk"
            assert sample == (end == len(seq))
            assert all(t >= 0 for t in seq.token_ids[:-1]), "a placeholder before the last token"
            if sample:
                last = seq.token_ids[-1]
                if last < 0:
                    last = int(sampled_ids[placeholder_row(last)])
                rows.append(EOS if last == ord("z") else (last + 1) % 256)
        self.prompt_logprobs = self._score_prompt(batch) if batch.prompt_rows else None
        return self._counting_logits(rows)

    def _score_prompt(self, batch):
        from llm_engine.worker.prompt_logprobs import PromptLogprobs
        from llm_engine.worker.sampler import token_logprobs

        nexts, targets, top = [], [], 0
        for i, first, count in batch.prompt_rows:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            assert seq.num_computed_tokens <= first and first + count <= seq.num_computed_tokens + n
            assert first + count < seq.num_prompt_tokens, "a scored position past the prompt's last but one"
            nexts += [(t + 1) % 256 for t in seq.token_ids[first:first + count]]
            targets += seq.token_ids[first + 1:first + count + 1]
            top = max(top, seq.sampling_params.prompt_logprobs)
        return PromptLogprobs(token_logprobs(self._counting_logits(nexts), torch.tensor(targets), [top]))

    @staticmethod
    def _counting_logits(nexts):
        logits = torch.zeros(len(nexts), ByteTokenizer.vocab_size)
        logits[torch.arange(len(nexts)), torch.tensor(nexts, dtype=torch.long)] = 20.0
        return logits

    def warmup(self):
        self.warmed_up = True

    def close(self):
        self.closed = True


def fake_config(**overrides):
    values = dict(block_size=4, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=32,
                  enable_prefix_caching=True, max_waiting=None, async_scheduling=True,
                  model_config=SimpleNamespace(vocab_size=ByteTokenizer.vocab_size))
    values.update(overrides)
    return SimpleNamespace(**values)


@pytest.fixture
def byte_tokenizer():
    return ByteTokenizer()


# Words of the clean-up tokenizer: punctuation and contractions that transformers' clean-up joins.
CLEANUP_WORDS = ["[UNK]", "[SEP]", "a", "b", "c", ".", ",", "!", "?", "'", "n't", "'s", "'ve", "n", "t", "s", "##s"]


@pytest.fixture
def cleanup_tokenizer_dir(tmp_path):
    """A WordPiece tokenizer folder with clean_up_tokenization_spaces (" ." -> ".", " ' " -> "'")."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    rust = RustTokenizer(models.WordPiece({w: i for i, w in enumerate(CLEANUP_WORDS)}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rust.decoder = decoders.WordPiece()
    rust.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "sep_token": "[SEP]",
        "clean_up_tokenization_spaces": True}))
    return tmp_path


@pytest.fixture
def fake_engine():
    """make(num_kv_blocks=..., **config) -> an LLMEngine over the counting fake model."""
    from llm_engine.engine.llm_engine import LLMEngine

    def make(num_kv_blocks: int = 64, **config):
        cfg = fake_config(**config)
        return LLMEngine(cfg, model_runner=CountingRunner(num_kv_blocks, cfg.block_size))

    return make


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: the GPU when there is one, else the interpreter's CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded per test case, so every case gets its own reproducible inputs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
