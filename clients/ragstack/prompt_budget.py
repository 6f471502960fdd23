"""The rag prompt, sized in the llm's own tokens: the prompt builder's budget (model_repository/prompt_builder).

The llm refuses a prompt that leaves no room for the answer: prompt + max_tokens must be at most its
max_model_len. So the prompt may take

    budget = max_model_len - max_tokens

tokens of the llm's tokenizer, counted on the prompt exactly as the llm renders it (its chat template
around the system prompt and the user message). What the question and the template take is counted
first; a question that leaves fewer than `min_context_tokens` for passages is refused (PromptTooLong,
INVALID_ARG with the numbers). Passages then go in strictly in the reranker's order: each one that fits
whole is added; the first that does not is trimmed to the room left if at least `min_passage_tokens`
remain (the first passage always is), and filling stops there, so a lower-ranked passage never takes
the place of a better one. The whole prompt is counted again at the end and the last passage trimmed
further if the tokenizer merged across a boundary.

Most prompts take every candidate whole, so the prompt with all of them is tokenized first. When it fits
(and the question leaves min_context_tokens, counted only for a prompt that close to the budget), that is
the prompt. Otherwise each passage's share of that tokenization (its tokens' offsets) is its cost in the
steps above. Four passages of 800 characters, Qwen2's tokenizer, this project's 2 GHz CPU: 1.2 ms, where
tokenizing each passage, the question and the prompt separately took 2.4 ms; a prompt that must leave
passages out costs the tokens of those too (+0.2 to +1.8 ms with passages of 1,500 to 3,000 characters).
"""
from __future__ import annotations

import bisect
import itertools
import json
from dataclasses import dataclass

DEFAULT_MAX_TOKENS = 16          # the llm's default max_tokens (llm_engine.SamplingParams)
NO_PASSAGES = "(no passages were found)"
ANSWER_INSTRUCTION = "Answer from the context above and cite the passages you use as [n]."


class PromptTooLong(ValueError):
    """The question (with the chat template) leaves too little of the llm's context for passages."""


@dataclass(frozen=True)
class Candidate:
    text: str
    label: str                       # what follows [n] in the prompt: "(source: faiss.html, lines 3-20)"


@dataclass(frozen=True)
class Placed:
    index: int                       # position among the candidates given
    text: str                        # as placed: the whole passage, or its trimmed head
    trimmed: bool


@dataclass(frozen=True)
class Prompt:
    messages: list[dict]
    placed: list[Placed]
    prompt_tokens: int               # the rendered prompt, exactly as the llm counts it
    budget: int                      # max_model_len - max_tokens


def user_message(query: str, context: str, instruction: str = ANSWER_INSTRUCTION) -> str:
    return f"Context:\n{context}\n\nQuestion: {query}\n\n{instruction}"


def block(n: int, candidate: Candidate, text: str) -> str:
    return f"[{n}] {candidate.label}\n{text}"


def effective_max_tokens(max_tokens_tensor: int | None, sampling_parameters: str | None,
                         request_parameters: str | None, reserve_when_unbounded: int) -> int:
    """The max_tokens the llm will apply, as backends/triton_llm/llm_request.py resolves it: the tensor,
    else `sampling_parameters`' (or, without that input, the request parameters') max_tokens, else 16.
    An explicit null (answer up to max_model_len) reserves `reserve_when_unbounded`. A value the llm
    will refuse anyway counts as the default: the llm's own error names it."""
    if max_tokens_tensor is not None:
        return max(1, int(max_tokens_tensor))
    raw = sampling_parameters if sampling_parameters is not None else request_parameters
    try:
        values = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):  # nested past the stack: the llm refuses it, naming the input
        return DEFAULT_MAX_TOKENS
    if not isinstance(values, dict) or "max_tokens" not in values:
        return DEFAULT_MAX_TOKENS
    value = values["max_tokens"]
    if value is None:
        return reserve_when_unbounded
    try:
        number = float(value)
    except (TypeError, ValueError):
        return DEFAULT_MAX_TOKENS
    # Past INT32 (infinity included) the llm refuses it, naming the value.
    return int(number) if 1 <= number < 2**31 and number.is_integer() else DEFAULT_MAX_TOKENS


class PromptBudget:
    """Builds the rag prompt for one llm: its tokenizer (llm_engine's, the llm's own chat template) and
    max_model_len."""

    def __init__(self, tokenizer, max_model_len: int, *, min_context_tokens: int = 64,
                 min_passage_tokens: int = 32):
        self.tokenizer = tokenizer                  # llm_engine.model.tokenizer.Tokenizer
        self.max_model_len = max_model_len
        self.min_context_tokens = min_context_tokens
        self.min_passage_tokens = min_passage_tokens
        self._backend = tokenizer.hf_tokenizer.backend_tokenizer

    def count(self, messages: list[dict]) -> int:
        return len(self.tokenizer.apply_chat_template(messages))

    def _tokens(self, text: str) -> int:
        return len(self._backend.encode(text, add_special_tokens=False).ids)

    def _head(self, text: str, tokens: int) -> str:
        """The longest head of `text` of at most `tokens` tokens, ended at a word where one is near."""
        if tokens <= 0:
            return ""
        offsets = self._backend.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= tokens:
            return text
        end = offsets[tokens - 1][1]
        space = max(text.rfind(" ", 0, end + 1), text.rfind("\n", 0, end + 1))
        if space > end * 0.8:
            end = space
        return text[:end].rstrip()

    def build(self, system_prompt: str, query: str, candidates: list[Candidate], max_tokens: int,
              instruction_suffix: str = "") -> Prompt:
        """The messages with as many of `candidates` (best first) as fit; PromptTooLong when the
        question alone leaves too little room. `instruction_suffix`: text a later step appends to the
        user message (rag_generate's JSON answer instruction), counted here too."""
        budget = self.max_model_len - max_tokens
        instruction = ANSWER_INSTRUCTION + instruction_suffix

        def messages(context: str) -> list[dict]:
            return [{"role": "system", "content": system_prompt},
                    {"role": "user", "content": user_message(query, context, instruction)}]

        costs, base = [], None
        if candidates:
            blocks = [block(n, c, c.text) for n, c in enumerate(candidates, 1)]
            whole = messages("\n\n".join(blocks))
            text = self.tokenizer.apply_chat_template(whole, tokenize=False)
            encoding = self._backend.encode(text, add_special_tokens=False)   # as `count` encodes it
            if len(encoding.ids) <= budget:
                # Every passage fits whole. The question alone takes fewer tokens than the whole prompt,
                # so only a prompt this close to the budget needs the question counted for the check below.
                if len(encoding.ids) + self.min_context_tokens > budget:
                    base = self.count(messages(""))
                if base is None or budget - base >= self.min_context_tokens:
                    return Prompt(whole, [Placed(i, c.text, False) for i, c in enumerate(candidates)],
                                  len(encoding.ids), budget)
            costs = _block_costs(text, encoding.offsets, blocks)
        if base is None:
            base = self.count(messages(""))
        room = budget - base
        needed = self.min_context_tokens if candidates else self._tokens(NO_PASSAGES)
        if room < needed:
            # The field to change: max_tokens while a smaller one would leave the room, else the question.
            field = "query" if base + needed > self.max_model_len - 1 else "max_tokens"
            raise PromptTooLong(
                f"{field}: with the chat template the question takes {base} tokens; the llm's max_model_len="
                f"{self.max_model_len} minus max_tokens={max_tokens} leaves {budget} for the prompt, and passages "
                f"need {needed} more (min_context_tokens); shorten the question or lower max_tokens")
        placed: list[Placed] = []
        used = 0
        for i, candidate in enumerate(candidates):
            n = len(placed) + 1
            sep = "\n\n" if placed else ""
            cost = costs[i] if costs else self._tokens(sep + block(n, candidate, candidate.text))
            if used + cost <= room:
                placed.append(Placed(i, candidate.text, False))
                used += cost
                continue
            header = self._tokens(sep + block(n, candidate, ""))
            left = room - used - header
            if left >= self.min_passage_tokens or not placed:
                head = self._head(candidate.text, left)
                if head:
                    placed.append(Placed(i, head, True))
            break
        blocks = [block(n, candidates[p.index], p.text) for n, p in enumerate(placed, 1)]
        chat = messages("\n\n".join(blocks) if blocks else NO_PASSAGES)
        total = self.count(chat)
        for _ in range(4):   # tokens merged across a boundary: trim the last passage by the excess
            if total <= budget or not placed:
                break
            last = placed[-1]
            excess = total - budget
            head = self._head(last.text, self._tokens(last.text) - excess - 2)
            if len(placed) > 1 and self._tokens(head) < self.min_passage_tokens:
                placed.pop()
            else:
                placed[-1] = Placed(last.index, head, True)
            blocks = [block(n, candidates[p.index], p.text) for n, p in enumerate(placed, 1)]
            chat = messages("\n\n".join(blocks) if blocks else NO_PASSAGES)
            total = self.count(chat)
        if total > budget:
            raise PromptTooLong(f"query: the prompt takes {total} tokens; max_model_len={self.max_model_len} minus "
                                f"max_tokens={max_tokens} leaves {budget}; shorten the question or lower max_tokens")
        return Prompt(chat, placed, total, budget)


def _block_costs(text: str, offsets: list[tuple[int, int]], blocks: list[str]) -> list[int]:
    """Each block's tokens in the prompt `text` (the separator before it included), from the offsets of
    its tokenization: the tokens that start in its span. An empty list where the template changed the
    passages' text so that they cannot be found in it."""
    at = text.find("\n\n".join(blocks))
    if at < 0:
        return []
    # Block k ends at `at` + the lengths of blocks 0..k + the two-character separators between them.
    ends = list(itertools.accumulate((len(b) + 2 for b in blocks), initial=at - 2))[1:]
    bounds = [at, *ends]
    below = [bisect.bisect_left(offsets, (bound,)) for bound in bounds]
    return [b - a for a, b in zip(below, below[1:])]

