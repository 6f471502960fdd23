"""The llm's prompt pieces (backends/triton_llm/prompt_pieces.py): they add up to the prompt with its special
tokens shown, also for a SentencePiece-style tokenizer that adds a BOS (Llama 2, Mistral), whose decoder
keeps a word's leading space after `<s>`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bos_tokenizer import bos_metaspace_tokenizer
from llm_engine.model.tokenizer import Tokenizer as LLMTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from prompt_pieces import prompt_pieces  # noqa: E402

TEXTS = ["Hello world the cat sat on the mat", "The capital of France is Paris"]


@pytest.fixture(scope="module")
def bos_metaspace(tmp_path_factory) -> LLMTokenizer:
    return bos_metaspace_tokenizer(tmp_path_factory.mktemp("bos-metaspace"), TEXTS)


def test_a_bos_is_its_own_text_and_the_first_word_keeps_no_space(bos_metaspace):
    ids = bos_metaspace.encode(TEXTS[0])
    assert ids[0] == 1 and bos_metaspace.decode(ids, False).startswith("<s> Hello")   # the decoder's own join
    pieces = prompt_pieces(bos_metaspace, ids)
    assert pieces[0] == "<s>" and "".join(pieces[1:]) == TEXTS[0]


def test_special_tokens_inside_the_prompt_are_shown(bos_metaspace):
    ids = bos_metaspace.encode("Hello world") + [2] + bos_metaspace.encode("the cat", add_special_tokens=False)
    assert "".join(prompt_pieces(bos_metaspace, ids)) == "<s>Hello world</s> the cat"   # "▁the": its space


def test_a_prompt_of_token_ids_adds_up_to_its_decoded_text(bos_metaspace):
    """The text vLLM echoes for a token-id prompt is tokenizer.decode(ids), special tokens kept: the pieces
    add up to it, so the echoed tokens' text_offset follow it."""
    for ids in (bos_metaspace.encode(TEXTS[0]),
                bos_metaspace.encode("Hello world") + [2] + bos_metaspace.encode("the cat", add_special_tokens=False)):
        pieces = prompt_pieces(bos_metaspace, ids, given_as_ids=True)
        assert len(pieces) == len(ids) and "".join(pieces) == bos_metaspace.decode(ids, False)
    pieces = prompt_pieces(bos_metaspace, bos_metaspace.encode(TEXTS[0]), given_as_ids=True)
    assert pieces[0] == "<s>" and pieces[1].startswith(" Hello")
