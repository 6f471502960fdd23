"""A prompt's tokens as pieces of its text, for prompt logprobs, with its special tokens shown, as vLLM's
prompt logprobs show them.

A prompt given as text: the pieces add up to that text with the special tokens the tokenizer added. They
come from a window without special tokens: with a BOS in it, SentencePiece's decoder (Llama 2, Mistral)
keeps the next word's leading space (`<s> Hello`), so the piece would be " Hello" where the text says
"Hello". Each special token's piece is its own text.

A prompt given as token ids has no text but the decoded one, which vLLM echoes: `tokenizer.decode(ids)` with
its special tokens (`<s> Hello`). Its pieces add up to that.
"""
from __future__ import annotations

from llm_engine.engine.detokenizer import IncrementalDetokenizer


def prompt_pieces(tokenizer, ids: list[int], given_as_ids: bool = False) -> list[str]:
    window = IncrementalDetokenizer(tokenizer, [], [], skip_special_tokens=not given_as_ids)
    pieces = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        window.add_token(token, check_stop=False, last=last)
        piece = window.emit(finished=last)
        if not given_as_ids and not piece and not tokenizer.decode([token], True):   # skipped in the window
            piece = tokenizer.decode([token], False)
        pieces.append(piece)
    return pieces
