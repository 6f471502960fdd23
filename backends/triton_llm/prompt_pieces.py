"""A prompt's tokens as pieces of its text, for prompt logprobs: the pieces add up to the prompt as the
tokenizer decodes it with its special tokens shown, as vLLM's prompt logprobs show them.

The pieces come from a window without special tokens: with a BOS in it, SentencePiece's decoder
(Llama 2, Mistral) keeps the next word's leading space (`<s> Hello`), so the piece would be " Hello"
where the text says "Hello". Each special token's piece is its own text.
"""
from __future__ import annotations

from llm_engine.engine.detokenizer import IncrementalDetokenizer


def prompt_pieces(tokenizer, ids: list[int]) -> list[str]:
    window = IncrementalDetokenizer(tokenizer, [], [], True)
    pieces = []
    for i, token in enumerate(ids):
        last = i == len(ids) - 1
        window.add_token(token, check_stop=False, last=last)
        piece = window.emit(finished=last)
        if not piece and not tokenizer.decode([token], True):   # a special token: skipped in the window
            piece = tokenizer.decode([token], False)
        pieces.append(piece)
    return pieces
