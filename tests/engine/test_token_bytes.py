"""Each token's own bytes (llm_engine/model/token_bytes.py) against the tokenizer's own decoding: on random ids
the tokens' bytes, joined, are the bytes the decoder makes of them, also where a character spans tokens."""
from __future__ import annotations

import json
import random

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401

from llm_engine.model.tokenizer import Tokenizer


def joined(tok: Tokenizer, ids: list[int], skip: bool = True) -> bytes:
    return b"".join(bytes(tok.token_bytes(i, skip)) for i in ids)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_byte_level_tokens_join_into_the_decoded_bytes(tiny_checkpoints, name):  # noqa: F811
    tok = Tokenizer(tiny_checkpoints[name])
    rng = random.Random(0)
    partial = 0
    for _ in range(500):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 12))]
        for skip in (True, False):
            data = joined(tok, ids, skip)
            # the decoder's lossy UTF-8 replaces what Python's errors="replace" does: both the maximal subparts
            assert data.decode(errors="replace") == tok.decode(ids, skip_special_tokens=skip)
        partial += any(not _is_utf8(bytes(tok.token_bytes(i))) for i in ids)
    assert partial > 100   # the byte alphabet's tokens (a third of this vocab) really split characters


def test_a_character_split_over_tokens_gets_each_tokens_part(tiny_checkpoints):  # noqa: F811
    tok = Tokenizer(tiny_checkpoints["tiny-llama"])
    ids = tok.encode("한 ☃", add_special_tokens=False)   # characters the tiny vocab holds only as bytes
    assert len(ids) == 7 and [bytes(tok.token_bytes(i)) for i in ids][:3] == [b"\xed", b"\x95", b"\x9c"]
    assert joined(tok, ids) == "한 ☃".encode()
    assert all(tok.decode([i]) == "\ufffd" for i in ids[:3])   # what the text alone says of each


def test_special_tokens_are_their_text_or_nothing_where_skipped(tiny_checkpoints):  # noqa: F811
    tok = Tokenizer(tiny_checkpoints["tiny-llama"])
    [end] = tok.encode("<|im_end|>", add_special_tokens=False)
    assert tok.token_bytes(end, skip_special_tokens=False) == tuple(b"<|im_end|>")
    assert tok.token_bytes(end) == ()
    assert tok.token_bytes(tok.vocab_size + 10) == ()   # past the vocab (a model's padded rows): no text


def test_sentencepiece_byte_fallback_tokens_are_their_byte_and_the_meta_space_a_space(tmp_path):
    tok = Tokenizer(_sentencepiece_folder(tmp_path))
    text = "ab a ☃é"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.hf_tokenizer.convert_ids_to_tokens(ids) == ["▁ab", "▁a", "▁", "<0xE2>", "<0x98>", "<0x83>", "é"]
    assert [bytes(tok.token_bytes(i)) for i in ids] == [b" ab", b" a", b" ", b"\xe2", b"\x98", b"\x83", "é".encode()]
    assert tok.decode(ids) == text and joined(tok, ids) == f" {text}".encode()   # decode drops the first space
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 8))]
        data = joined(tok, ids)
        if _is_utf8(data):   # (ByteFallback makes each byte of a broken sequence a U+FFFD: not Python's rule)
            assert tok.decode(ids) == data.decode().removeprefix(" ")


def test_other_tokenizers_give_the_token_decoded_alone(cleanup_tokenizer_dir):
    tok = Tokenizer(cleanup_tokenizer_dir)   # WordPiece
    for i in range(tok.vocab_size):
        assert bytes(tok.token_bytes(i, skip_special_tokens=False)) == tok.decode([i], False, False).encode()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _sentencepiece_folder(folder):
    """A Llama 2 style tokenizer.json: BPE with byte fallback, "▁" for spaces, the decoder's Sequence."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ("▁", "a", "b", "é", "▁a", "ab", "▁ab"):
        vocab[piece] = len(vocab)
    rust = RustTokenizer(models.BPE(vocab, [("▁", "a"), ("a", "b"), ("▁a", "b")], unk_token="<unk>",
                                    byte_fallback=True, fuse_unk=True))
    rust.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    rust.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    rust.add_special_tokens(["<unk>", "<s>", "</s>"])
    rust.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return folder
