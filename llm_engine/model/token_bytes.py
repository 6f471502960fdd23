"""Each token's own bytes (OpenAI's logprobs `bytes`), which no decoded text gives: a token that holds part
of a multibyte character decodes to "" or U+FFFD alone.

Where they come from depends on the tokenizer's decoder (tokenizer.json):
  byte-level BPE (GPT-2, Llama 3, Qwen): each character of a vocab token stands for one byte (GPT-2's
      bytes_to_unicode alphabet);
  SentencePiece style (a ByteFallback, Metaspace or "▁" -> " " decoder: Llama 2, Mistral, Gemma): "<0xE3>" is
      that byte, any other token its UTF-8 with "▁" as a space (also where decode drops the text's first space);
  any other decoder, and added tokens (special or not): the UTF-8 of the token decoded alone.
A special token skipped from the text (skip_special_tokens) has no bytes, as it has no text.
"""
from __future__ import annotations

import json
import re

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes stand for themselves, the rest for U+0100 on."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    alphabet, shifted = {}, 0
    for b in range(256):
        if b in printable:
            alphabet[chr(b)] = b
        else:
            alphabet[chr(256 + shifted)] = b
            shifted += 1
    return alphabet


def _decoders(decoder) -> list[dict]:
    """The tokenizer's decoder and, for a Sequence, the decoders in it, as tokenizer.json writes them."""
    if decoder is None:
        return []
    state = json.loads(decoder.__getstate__())
    return state.get("decoders") or [state]


class TokenBytes:
    """`token_bytes(id, skip_special_tokens)` -> the token's bytes, as a tuple of ints (JSON-ready); each
    token's worked out once, on first use (a vocab may hold 256k tokens, an answer uses few)."""

    def __init__(self, hf_tokenizer) -> None:
        self._backend = hf_tokenizer.backend_tokenizer
        added = hf_tokenizer.added_tokens_decoder
        self._added = set(added)
        self._special = {i for i, token in added.items() if token.special}
        decoders = _decoders(self._backend.decoder)
        kinds = {d["type"] for d in decoders}
        self._alphabet = _byte_alphabet() if "ByteLevel" in kinds else None
        self._space = next((d.get("replacement", "▁") for d in decoders if d["type"] == "Metaspace"), None)
        if any(d["type"] == "Replace" and d.get("pattern", {}).get("String") == "▁" for d in decoders):
            self._space = "▁"
        self._byte_fallback = "ByteFallback" in kinds
        self._cache: dict[int, tuple[int, ...]] = {}

    def __call__(self, token_id: int, skip_special_tokens: bool = True) -> tuple[int, ...]:
        if skip_special_tokens and token_id in self._special:
            return ()
        known = self._cache.get(token_id)
        if known is None:
            known = self._cache[token_id] = tuple(self._bytes(token_id))
        return known

    def _bytes(self, token_id: int) -> bytes:
        token = None if token_id in self._added else self._backend.id_to_token(token_id)
        if token is not None and self._alphabet is not None and all(c in self._alphabet for c in token):
            return bytes(self._alphabet[c] for c in token)
        if token is not None and (self._byte_fallback or self._space is not None):
            byte = _BYTE_FALLBACK.fullmatch(token) if self._byte_fallback else None
            if byte:
                return bytes([int(byte[1], 16)])
            return (token.replace(self._space, " ") if self._space else token).encode()
        return self._backend.decode([token_id], skip_special_tokens=False).encode()
