"""A byte-level BPE tokenizer of up to 128,256 tokens (Llama 3's vocabulary size) trained on the Python
standard library's sources: a real tokenizer's shape for benchmarks that need one (structured output
masks every token of the vocabulary), since no real model's tokenizer may be downloaded here. Its
end-of-sequence token is `<|eos|>`, id 0.

    python -m benchmarks.bpe_tokenizer --out /tmp/bpe   # then make_random_model.py --tokenizer /tmp/bpe
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 128256
CACHE = Path("/tmp/ragstack-bench-grammar-tokenizer")
EOS = "<|eos|>"


def train(out: Path = CACHE, vocab_size: int = VOCAB) -> Path:
    """Trains into `out` (about a minute on two cores) unless a tokenizer is there already."""
    if (out / "tokenizer.json").exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(json.__file__).resolve().parents[1]
    sources = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((p.read_text(errors="replace") for p in sources), trainer)
    out.mkdir(parents=True, exist_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=CACHE)
    print(train(parser.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
