"""Incremental detokenization and stop-string detection for one request.

Decoding token by token breaks on byte-level pieces (a multibyte character split over tokens)
and on tokenizers whose decode depends on the neighbouring tokens (SentencePiece's leading space).
The prefix-offset / read-offset technique (vLLM, TGI) decodes only a short window: the tokens
[prefix_offset, read_offset) already emitted, for context, plus the new ones; the new text is
what the window decodes to beyond the context. A window ending in an incomplete character
(U+FFFD) waits for the next token. Each step decodes a few tokens, never the whole output.

A tokenizer whose decode also cleans up the text (`cleans_up`: transformers' " ." -> ".",
" ' " -> "'", ...) is decoded raw, and the clean-up runs on raw text up to the last character
that appears in none of its patterns: the clean-up only deletes spaces, so such a character stays
and no pattern ever spans it, and the text before it cleans up alone. The rest waits.

With `include_stop_str_in_output` (vLLM's) the text is cut just after the stop string instead, and nothing
is held back: what could begin a stop string is shown either way.
"""
from __future__ import annotations

# How many prompt tokens give the first output token its decoding context (as vLLM).
_INITIAL_CONTEXT = 5
# What transformers' clean_up_tokenization replaces (each by itself without the leading space).
_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
_CLEANUP_CHARS = frozenset("".join(_CLEANUP_PATTERNS))


class IncrementalDetokenizer:
    """Feed each generated token with `add_token`, then `emit` the text that is safe to show.

    Text that could be the start of a stop string is held back until it is known not to be one;
    when a stop string appears, the text is cut just before it (just after it with
    `include_stop_str_in_output`) and `stop_string` names it.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], stop: list[str] = (),
                 skip_special_tokens: bool = True, include_stop_str_in_output: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids = list(prompt_token_ids[-_INITIAL_CONTEXT:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stop = list(stop)
        self._include_stop = include_stop_str_in_output
        self._cleans_up = tokenizer.cleans_up
        self._raw_pending = ""  # raw text not yet cleaned up (cleans_up tokenizers)
        self._check_stop = True  # the last add_token's: the final flush checks stop strings as it did
        self._stop_floor = 0     # text before this came below min_tokens: a stop string must end past it
        self._text = ""       # decoded output text (cut at the stop string once one is found)
        self._emitted = 0     # chars of _text already returned by emit()
        self.stop_string: str | None = None  # the stop string that ended the text

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stop)

    @property
    def text(self) -> str:
        """The output text emitted so far."""
        return self._text[:self._emitted]

    def add_token(self, token_id: int, check_stop: bool = True, last: bool = False) -> None:
        """Decode one more token; `check_stop` False (below min_tokens) ignores stop strings;
        `last`: the request ends with it, so no text waits for a later token's clean-up."""
        if self.stopped:
            return
        self._check_stop = check_stop
        self._ids.append(token_id)
        new_text = self._clean(self._decode_new(final=False), final=last)
        if new_text:
            self._append(new_text, check_stop)
        if not check_stop:  # (with the text still held for the clean-up, as it will read)
            pending = self._tokenizer.clean_up(self._raw_pending) if self._raw_pending else ""
            self._stop_floor = len(self._text) + len(pending)
        elif self._stop and self._raw_pending and not self.stopped and self._stop_in_pending():
            # Ending here makes the held text final: its clean-up is known now, and so is the stop.
            self._append(self._clean("", final=True), check_stop)

    def _stop_in_pending(self) -> bool:
        """Whether a stop string ends within the text that waits for the clean-up, as it would read
        if the output ended now."""
        text = self._text + self._tokenizer.clean_up(self._raw_pending)
        return any(text.find(s, self._stop_search_start(s, len(self._text))) != -1 for s in self._stop)

    def _stop_search_start(self, stop: str, start: int) -> int:
        """Where to look for `stop` in text that grew from `start`: it may straddle that boundary
        with earlier, not yet emitted, text, but not end at or before the min_tokens floor. (Text emitted
        is known to begin no stop string, unless include_stop_str_in_output showed it without holding back.)"""
        shown = 0 if self._include_stop else self._emitted
        return max(shown, start - len(stop) + 1, self._stop_floor - len(stop) + 1)

    def add_tokens(self, token_ids: list[int]) -> None:
        """Decode several tokens in one window: the text add_token would give one by one (decode
        concatenates across the window's boundaries), for a request whose text is only needed at
        its end. Not with stop strings: those must be checked as each token arrives."""
        if self._stop:
            raise ValueError("add_tokens cannot check stop strings; feed the tokens with add_token")
        self._ids.extend(token_ids)
        self._text += self._clean(self._decode_new(final=False), final=False)

    def emit(self, finished: bool = False) -> str:
        """Text newly safe to show. With `finished`, flush everything held back (pending partial
        characters included, as U+FFFD) unless the output ended on a stop string."""
        if finished and not self.stopped:
            self._append(self._clean(self._decode_new(final=True), final=True), self._check_stop)
            end = len(self._text)
        else:
            end = len(self._text) - self._stop_prefix_len()
        delta = self._text[self._emitted:end]
        self._emitted = max(self._emitted, end)
        return delta

    def _decode_new(self, final: bool) -> str:
        ids = self._ids
        if self._read_offset == len(ids):
            return ""
        prefix = self._decode(ids[self._prefix_offset:self._read_offset])
        full = self._decode(ids[self._prefix_offset:])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""  # nothing printable yet (special token skipped, or character incomplete)
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        return full[len(prefix):]

    def _decode(self, ids: list[int]) -> str:  # raw: _clean applies the clean-up
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special, clean_up=False)

    def _clean(self, raw: str, final: bool) -> str:
        """The cleaned-up text of the raw text so far that no later token can change (all of
        it when `final`); the rest waits."""
        if not self._cleans_up:
            return raw
        pending = self._raw_pending + raw
        cut = len(pending) if final else _clean_cut(pending)
        self._raw_pending = pending[cut:]
        return self._tokenizer.clean_up(pending[:cut]) if cut else ""

    def _append(self, new_text: str, check_stop: bool) -> None:
        start = len(self._text)
        self._text += new_text
        if not (check_stop and self._stop):
            return
        cut = -1
        for s in self._stop:
            i = self._text.find(s, self._stop_search_start(s, start))
            if i != -1 and (cut == -1 or i < cut):
                cut, self.stop_string = i, s
        if cut != -1:
            self._text = self._text[:cut + len(self.stop_string) if self._include_stop else cut]

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that begins some stop string (none to hold back once
        stopped, or when the stop string is shown anyway)."""
        if self.stopped or self._include_stop:
            return 0
        text = self._text
        longest = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest


def _clean_cut(text: str) -> int:
    """Where raw text splits into a head the clean-up can finish alone and a tail that later text
    may still change: after the last character in no clean-up pattern."""
    for i in range(len(text) - 1, -1, -1):
        if text[i] not in _CLEANUP_CHARS:
            return i + 1
    return 0
