"""The rag prompt's budget in the llm's own tokens (ragstack.prompt_budget) with the demo llm's tokenizer
and chat template: the rendered prompt plus max_tokens never passes max_model_len, passages go in strictly
in order (the first that does not fit is trimmed, none after it), and a question that leaves no room is
refused with the numbers, as INVALID_ARG once it reaches the client."""
from __future__ import annotations

import json

import pytest

from llm_engine.model.tokenizer import Tokenizer
from ragstack.error_codes import code_from_message
from ragstack.launcher import ROOT
from ragstack import prompt_budget
from ragstack.prompt_budget import Candidate, PromptBudget, PromptTooLong, effective_max_tokens

SYSTEM = "You answer questions using only the numbered context passages you are given."


@pytest.fixture(scope="module")
def budget() -> PromptBudget:
    return PromptBudget(Tokenizer(ROOT / "model_repository" / "llm" / "1" / "tiny-qwen2"), 2048)


def candidates(*sizes: int) -> list[Candidate]:
    return [Candidate(" ".join(f"w{i}x{j}" for j in range(size)), f"(source: d{i}.md, lines 1-{size})")
            for i, size in enumerate(sizes)]


@pytest.mark.parametrize("max_tokens", [1, 16, 300, 1000, 1850])
@pytest.mark.parametrize("sizes", [(50, 60, 70), (400, 400, 400, 400, 10), (3000,), (10, 2000, 10)])
def test_the_prompt_and_the_answer_fit_in_max_model_len(budget, max_tokens, sizes):
    prompt = budget.build(SYSTEM, "What is w0x3?", candidates(*sizes), max_tokens)
    assert prompt.prompt_tokens == budget.count(prompt.messages) <= 2048 - max_tokens == prompt.budget
    placed = [p.index for p in prompt.placed]
    assert placed == list(range(len(placed)))                    # strictly in order, none skipped
    assert all(not p.trimmed for p in prompt.placed[:-1])         # only the last may be trimmed
    if len(placed) < len(sizes) or (prompt.placed and prompt.placed[-1].trimmed):
        assert prompt.prompt_tokens > prompt.budget - 64          # it stopped because the room was used
    user = prompt.messages[1]["content"]
    assert user.startswith("Context:\n[1] (source: d0.md, lines 1-") and "Question: What is w0x3?" in user


def test_a_passage_that_does_not_fit_is_trimmed_and_nothing_after_it(budget):
    prompt = budget.build(SYSTEM, "q?", candidates(100, 1500, 20), 600)
    assert [(p.index, p.trimmed) for p in prompt.placed] == [(0, False), (1, True)]
    trimmed = prompt.placed[1].text
    assert candidates(100, 1500, 20)[1].text.startswith(trimmed) and len(trimmed) < len(candidates(0, 1500)[1].text)


def test_a_question_that_leaves_no_room_is_refused_with_the_numbers(budget):
    with pytest.raises(PromptTooLong) as info:
        budget.build(SYSTEM, "why " * 500, candidates(10), 1600)
    message = str(info.value)
    assert message.startswith("max_tokens: with the chat template the question takes ")   # 1 would leave room
    assert "the llm's max_model_len=2048 minus max_tokens=1600 leaves 448 for the prompt" in message
    assert code_from_message(f"in ensemble 'rag', {message}") == "INVALID_ARG"


def test_the_json_answer_instruction_is_counted(budget):
    plain = budget.build(SYSTEM, "q?", candidates(5000), 16)
    json_answer = budget.build(SYSTEM, "q?", candidates(5000), 16, instruction_suffix=" Reply with JSON. " * 20)
    assert json_answer.prompt_tokens <= json_answer.budget and len(json_answer.placed[0].text) < len(plain.placed[0].text)


@pytest.mark.parametrize("tensor, sampling, parameters, expected", [
    (None, None, None, 16),                                       # the llm's default
    (100, json.dumps({"max_tokens": 5}), None, 100),              # the tensor wins, as in the llm
    (None, json.dumps({"max_tokens": "40"}), None, 40),           # vLLM's strings
    (None, None, json.dumps({"max_tokens": 7}), 7),               # HTTP generate's parameters
    (None, json.dumps({"temperature": 0}), json.dumps({"max_tokens": 7}), 16),   # sampling_parameters first
    (None, json.dumps({"max_tokens": None}), None, 256),          # up to max_model_len: the reserve
    (None, json.dumps({"max_tokens": -3}), None, 16),             # the llm refuses it, naming it
    (None, "not json", None, 16),
    (None, "[" * 100_000 + "]" * 100_000, None, 16),               # past Python's stack: the llm refuses it
    (None, '{"max_tokens": 1e400}', None, 16),                     # infinity: the llm refuses it
    (None, '{"max_tokens": ' + "9" * 40 + "}", None, 16),           # past INT32 (and 32 digits): likewise
])
def test_max_tokens_as_the_llm_resolves_it(tensor, sampling, parameters, expected):
    assert effective_max_tokens(tensor, sampling, parameters, 256) == expected


def test_each_passages_share_of_the_whole_prompt_is_its_block_counted_alone(budget):
    blocks = [prompt_budget.block(n, c, c.text) for n, c in enumerate(candidates(40, 7, 90), 1)]
    text = budget.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt_budget.user_message("q?", "\n\n".join(blocks))}], tokenize=False)
    shares = prompt_budget._block_costs(text, budget._backend.encode(text, add_special_tokens=False).offsets, blocks)
    assert shares == [budget._tokens(("\n\n" if n else "") + b) for n, b in enumerate(blocks)]
    assert prompt_budget._block_costs(text.replace("[2]", "[two]"), [], blocks) == []   # not found: none


def test_a_prompt_of_every_passage_within_min_context_tokens_of_the_budget_is_still_checked(budget):
    """Whole passages that fit, but with a question that leaves less than min_context_tokens: refused, as
    when the passages are placed one by one."""
    question = " ".join(["why"] * 630)   # 1,989 tokens with the template; with the passage, 2,024 of 2,032
    with pytest.raises(PromptTooLong, match="^query: with the chat template the question takes 1989 tokens"):
        budget.build(SYSTEM, question, candidates(3), 16)
