"""The llm's `logprobs` output in OpenAI's two shapes (chat's `content` list, completions' four lists).

The llm sends, per response, one object per new token: `{token id: {logprob, rank, decoded_token}}`
over its N most likely tokens (ranks 1..N, in order) and the sampled token. A sampled token outside
the top N is the last entry; one inside it shares its entry. Our llm marks the sampled token's entry
(`"sampled": true`), and the Matcher takes that one. A vllm_backend model (or an older llm) marks none: the
sampled tokens' `decoded_token`s add up to the text, so the Matcher searches for the entries that spell it,
which guesses wrong where pieces are equal (an alternative "▁a" decoded alone is the "a" of "ba"; a
character's partial bytes all read U+FFFD; a skipped special token reads "" as a character's first byte does).
Our llm adds each token's own `bytes`, which chat's `bytes` and `token` come from (a vllm_backend model has
none: the piece and its UTF-8 then); the pieces cannot give them where a character spans tokens (the piece of
each token but the last is "", the last's the whole character; an alternative's U+FFFD).

As OpenAI: each token's `logprob` is the sampled token's own. Chat's `top_logprobs` are the N most likely,
which hold the sampled token only where it is one of them; completions' `top_logprobs` are the N most
likely plus the sampled token ("up to logprobs+1 elements": the API always returns the sampled token's).

With `echo`, the prompt's tokens come first: the llm's `prompt_logprobs` output holds per token the same
entries, its own last, every entry with its rank; the first token's alone, with a null logprob (nothing
before it scores it). The own entries' `decoded_token`s add up to the decoded prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

# One llm entry as the Matcher reads it: (decoded_token, logprob, bytes or None).
_Entry = tuple[str, float, list[int] | None]


@dataclass(frozen=True)
class Alternative:
    token: str
    logprob: float
    raw: list[int] | None = None   # the token's own bytes, where the llm sent them


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float | None      # None: the prompt's first token
    top: list[Alternative] | None   # the N most likely, most likely first
    raw: list[int] | None = None


class Matcher:
    """One choice's tokens, response by response: which entry was sampled."""

    def __init__(self, top_n: int):
        self.top_n = top_n
        self._unmatched = ""   # text not yet accounted for by a sampled token

    def add(self, raw: bytes | str, text: str) -> list[TokenLogprob]:
        entries = json.loads(raw) or []
        candidates = [self._candidates(entry) for entry in entries]
        self._unmatched += text
        # One candidate each (marked, or outside the top N): nothing to search; the text is still taken piece by
        # piece, as the sampled pieces add up to it.
        picks = ([options[0] for options in candidates] if all(len(options) == 1 for options in candidates)
                 else _spell(candidates, self._unmatched))
        if picks is None:   # e.g. a stop string cut from the text: in order, the first that fits, else the likeliest
            picks = []
            for options in candidates:
                picks.append(next((c for c in options if self._unmatched.startswith(c[0])), options[0]))
                self._take(picks[-1][0])
        else:
            for token, *_ in picks:
                self._take(token)
        return [TokenLogprob(token, logprob, [Alternative(*a) for a in options[:self.top_n]], raw)
                for (token, logprob, raw), options in zip(picks, map(self._top, entries), strict=True)]

    def _take(self, token: str) -> None:
        self._unmatched = self._unmatched[len(token):] if self._unmatched.startswith(token) else ""

    def _candidates(self, entry: dict) -> list[_Entry]:
        """The entries that may be the sampled token: the marked one; unmarked, the last alone when there are
        N + 1, else all."""
        values = self._top(entry)
        marked = [value for value, e in zip(values, entry.values()) if e.get("sampled")]
        if marked:
            return marked
        return values[-1:] if len(values) > self.top_n else values

    @staticmethod
    def _top(entry: dict) -> list[_Entry]:
        return [(v["decoded_token"], v["logprob"], v.get("bytes")) for v in entry.values()]


def _spell(candidates: list[list[_Entry]], text: str) -> list[_Entry] | None:
    """One candidate per token whose texts, in order, spell `text`, or else a prefix of it (the llm
    holds back text it may still cut at a stop string); the most likely first."""
    return _search(candidates, text, whole=True) or _search(candidates, text, whole=False)


def _search(candidates: list[list[_Entry]], text: str, whole: bool) -> list[_Entry] | None:
    """Depth-first over the tokens, iteratively (a response may hold thousands), remembering the
    (token, position) pairs that lead nowhere."""
    n = len(candidates)
    picks, starts, failed = [-1] * n, [0] * (n + 1), set()
    i = 0
    while i >= 0:
        if i == n:
            if not whole or starts[n] == len(text):
                return [candidates[k][picks[k]] for k in range(n)]
            failed.add((n, starts[n]))
            i -= 1
            continue
        at, k = starts[i], picks[i] + 1
        while k < len(candidates[i]) and not (text.startswith(candidates[i][k][0], at)
                                              and (i + 1, at + len(candidates[i][k][0])) not in failed):
            k += 1
        if k == len(candidates[i]):
            failed.add((i, at))
            picks[i] = -1
            i -= 1
        else:
            picks[i], starts[i + 1] = k, at + len(candidates[i][k][0])
            i += 1
    return None


def chat_content(tokens: list[TokenLogprob]) -> list[dict]:
    """Chat's `logprobs.content` items."""
    return [{**_chat_token(t.token, t.logprob, t.raw),
             "top_logprobs": [_chat_token(a.token, a.logprob, a.raw) for a in t.top]} for t in tokens]


def _chat_token(token: str, logprob: float, raw: list[int] | None) -> dict:
    """`token`, `logprob` and `bytes` as OpenAI has them: where the llm sent the token's bytes, the token is
    their text, a part of a character escaped ("\\xeb\\x8b"). Its piece would not do: that is "" or the whole
    character for a character's parts, an alternative's U+FFFD, and U+FFFD + "ab" for "ab" after a broken
    character (the Matcher still matches the pieces, which add up to the text)."""
    if raw is None:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {"token": bytes(raw).decode(errors="backslashreplace"), "logprob": logprob, "bytes": raw}


def completion_logprobs(tokens: list[TokenLogprob], offset: int, echoed: list[TokenLogprob] = (),
                        echo: str = "") -> dict:
    """Completions' `logprobs`; `offset`: where the first token starts in the choice's text; `echoed`: the echoed
    prompt's tokens, before them, from the start of `echo` (the echoed text). A prompt token the text does not go
    on with (a special token the tokenizer added to a text prompt, as a BOS) sits where the text goes on."""
    offsets, at = [], 0
    for t in echoed:
        offsets.append(at)
        if echo.startswith(t.token, at):
            at += len(t.token)
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    every = [*echoed, *tokens]
    return {"tokens": [t.token for t in every], "token_logprobs": [t.logprob for t in every],
            "top_logprobs": [_with_sampled(t) for t in every], "text_offset": offsets}


def prompt_scores(entries: list, top_n: int) -> list[TokenLogprob]:
    """The llm's `prompt_logprobs` output (parsed): the prompt's tokens, the first without a logprob."""
    tokens = []
    for entry in entries:
        values = list(entry.values())
        own = values[-1]
        top = sorted((v for v in values if v["rank"] is not None and v["rank"] <= top_n), key=lambda v: v["rank"])
        alternatives = [Alternative(v["decoded_token"], v["logprob"], v.get("bytes")) for v in top]
        tokens.append(TokenLogprob(own["decoded_token"], own["logprob"], None if own["rank"] is None else alternatives,
                                   own.get("bytes")))
    return tokens


def vllm_prompt_logprobs(entries: list) -> list:
    """The llm's `prompt_logprobs` output as vLLM answers it: None for the first token, and each entry's
    logprob, rank and decoded_token alone (without our llm's bytes)."""
    return [None, *({token: {k: v for k, v in e.items() if k != "bytes"} for token, e in entry.items()}
                    for entry in entries[1:])]


def _with_sampled(t: TokenLogprob) -> dict[str, float] | None:
    """The N most likely, most likely first, then the sampled token where it is not among them. The sampled
    token's key is its piece, as in `tokens`. Distinct tokens can share a piece (a character's partial bytes all
    read U+FFFD): the likeliest keeps it, the others are keyed by their bytes (OpenAI's `bytes:\\xe4\\xbd`), and one
    with no bytes to tell it apart is left out."""
    if t.top is None:
        return None
    sampled = next((a for a in t.top if (a.token, a.logprob, a.raw) == (t.token, t.logprob, t.raw)), None)
    top: dict[str, float] = {}
    for a in t.top:
        key = t.token if a is sampled else next(
            (k for k in (a.token, _bytes_key(a.raw)) if k is not None and k not in top and k != t.token), None)
        if key is not None:
            top[key] = a.logprob
    top.setdefault(t.token, t.logprob)
    return top


def _bytes_key(raw: list[int] | None) -> str | None:
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw) if raw else None
