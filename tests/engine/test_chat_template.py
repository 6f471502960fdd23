"""Tokenizer.apply_chat_template with vLLM's chat template arguments (the llm's `chat_template_kwargs` input),
on a tiny checkpoint's own ChatML template: no generation prompt, the last assistant message left open for the
model to continue, RAG documents and a template variable (Qwen3's enable_thinking) reaching the template."""
from __future__ import annotations

import pytest
from tiny_checkpoints import tiny_checkpoints  # noqa: F401

from llm_engine.model.tokenizer import Tokenizer

CHAT = [{"role": "user", "content": "Hi"}]
PREFILL = [*CHAT, {"role": "assistant", "content": "Once upon"}]
# Before the checkpoint's template: documents, as RAG templates render them; after it: Qwen3's empty thinking
# block when enable_thinking is false.
DOCUMENTS = "{% for d in documents or [] %}{{ '[' + d.title + '] ' + d.text + '\\n' }}{% endfor %}"
THINKING = "{% if add_generation_prompt and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"


@pytest.fixture
def tok(tiny_checkpoints):  # noqa: F811
    return Tokenizer(tiny_checkpoints["tiny-qwen2"])


def test_no_generation_prompt_ends_at_the_last_turn(tok):
    with_prompt = tok.apply_chat_template(CHAT, tokenize=False)
    assert with_prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False, tokenize=False) == \
        "<|im_start|>user\nHi<|im_end|>\n"


def test_continue_final_message_leaves_the_assistant_message_open(tok):
    text = tok.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True, tokenize=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nOnce upon"
    closed = tok.apply_chat_template(PREFILL, add_generation_prompt=False, tokenize=False)
    assert closed == text + "<|im_end|>\n"
    ids = tok.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert tok.hf_tokenizer.convert_tokens_to_ids("<|im_end|>") != ids[-1]


def test_documents_and_template_variables_reach_the_template(tok):
    tok.hf_tokenizer.chat_template = DOCUMENTS + tok.hf_tokenizer.chat_template + THINKING
    plain = tok.apply_chat_template(CHAT, tokenize=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    docs = [{"title": "Paris", "text": "the capital"}, {"title": "Lyon", "text": "a city"}]
    text = tok.apply_chat_template(CHAT, tokenize=False, documents=docs, enable_thinking=False)
    assert text == ("[Paris] the capital\n[Lyon] a city\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.apply_chat_template(CHAT, tokenize=False, enable_thinking=True) == plain
    thinking_off = tok.apply_chat_template(CHAT, tokenize=False, enable_thinking=False)
    assert thinking_off == plain + "<think>\n\n</think>\n\n"
    assert tok.apply_chat_template(CHAT, enable_thinking=False) == tok.encode(thinking_off, add_special_tokens=False)


def test_a_template_that_refuses_a_variable_or_a_continuation_is_a_value_error_naming_the_messages(tok):
    tok.hf_tokenizer.chat_template = ("{% if mode is defined and mode != 'fast' %}{{ raise_exception('mode must be "
                                      "fast') }}{% endif %}" + tok.hf_tokenizer.chat_template)
    with pytest.raises(ValueError, match="messages: the model's chat template refused them: mode must be fast"):
        tok.apply_chat_template(CHAT, mode="slow")
    tok.hf_tokenizer.chat_template = "{% for m in messages %}{{ m.role }}{% endfor %}"  # never writes the content
    with pytest.raises(ValueError, match=r"^messages: the model's chat template refused them: continue_final_message"):
        tok.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True)
