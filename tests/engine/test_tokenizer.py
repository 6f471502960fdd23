"""Tokenizer.decode skips transformers' wrapper for speed: it must still give the wrapper's text."""
from __future__ import annotations

import random

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401

from llm_engine.model.tokenizer import Tokenizer


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-qwen2"])
def test_decode_matches_the_hf_tokenizer_on_random_ids(tiny_checkpoints, name):  # noqa: F811
    tok = Tokenizer(tiny_checkpoints[name])
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 12))]
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == tok.hf_tokenizer.decode(ids, skip_special_tokens=skip)


def test_decode_applies_the_clean_up_where_the_hf_tokenizer_does(cleanup_tokenizer_dir):
    """A WordPiece tokenizer with clean_up_tokenization_spaces: " ." becomes "." in both."""
    tok = Tokenizer(cleanup_tokenizer_dir)
    assert tok.cleans_up
    ids = tok.encode("a . b , c ! a ? [SEP] b", add_special_tokens=False)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == tok.hf_tokenizer.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids) == "a. b, c! a? b"
    quote = tok.encode("a ' b", add_special_tokens=False)  # a clean-up across three tokens
    assert tok.decode(quote) == tok.hf_tokenizer.decode(quote) == "a'b"
    assert tok.decode(quote, clean_up=False) == "a ' b"
