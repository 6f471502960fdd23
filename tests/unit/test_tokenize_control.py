"""The llm's tokenize and detokenize control requests (backends/triton_llm/tokenize_control.py) with the demo
checkpoint's tokenizer: which requests they are, what they answer, and refusals in words
ragstack.error_codes reads as INVALID_ARG."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from llm_request import InvalidRequest  # noqa: E402
from tokenize_control import DETOKENIZE_KEY, TOKENIZE_KEY, answer  # noqa: E402

from bos_tokenizer import bos_metaspace_tokenizer  # noqa: E402
from ragstack.error_codes import code_from_message  # noqa: E402

CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from llm_engine.model.tokenizer import Tokenizer
    from ragstack.tiny_checkpoints import train_tokenizer, write_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(train_tokenizer(), folder)
    return Tokenizer(folder)


def ask(tokenizer, parameters: dict, **inputs) -> dict | None:
    tensors = {name: np.array(value, dtype=np.int32) if name == "prompt_token_ids"
               else np.array([value.encode()], dtype=np.object_) for name, value in inputs.items()}
    raw = answer(tensors.get, json.dumps(parameters), tokenizer, 2048, 1 << 20)
    return None if raw is None else json.loads(raw)


def test_other_requests_are_not_control_requests(tokenizer):
    assert ask(tokenizer, {}, text_input="Hello") is None
    assert ask(tokenizer, {"temperature": 0}, text_input="Hello") is None


def test_a_prompt_is_tokenized_as_the_engine_encodes_it(tokenizer):
    text = "The engineers measured the latency."
    got = ask(tokenizer, {TOKENIZE_KEY: True}, text_input=text)
    assert got == {"count": len(tokenizer.encode(text)), "max_model_len": 2048, "tokens": tokenizer.encode(text),
                   "token_strs": None}
    strs = ask(tokenizer, {TOKENIZE_KEY: True, "return_token_strs": True}, text_input=text)["token_strs"]
    assert "".join(strs).replace("\u0120", " ") == text   # byte-level pieces: a space is written Ġ


def test_messages_are_rendered_as_a_generation_renders_them(tokenizer):
    got = ask(tokenizer, {TOKENIZE_KEY: True}, messages=json.dumps(CHAT))
    assert got["tokens"] == tokenizer.apply_chat_template(CHAT)
    bare = ask(tokenizer, {TOKENIZE_KEY: True}, messages=json.dumps(CHAT),
               chat_template_kwargs=json.dumps({"add_generation_prompt": False}))
    assert bare["tokens"] == tokenizer.apply_chat_template(CHAT, add_generation_prompt=False)
    assert bare["count"] < got["count"]


def test_an_empty_prompt_is_its_special_tokens_alone(tokenizer, tmp_path):
    """vLLM's tokenize of "": no tokens, or the BOS a tokenizer adds (this one adds none)."""
    assert ask(tokenizer, {TOKENIZE_KEY: True}, text_input="") == {
        "count": 0, "max_model_len": 2048, "tokens": [], "token_strs": None}
    with_bos = bos_metaspace_tokenizer(tmp_path, ["Hello world the cat sat on the mat"])
    assert ask(with_bos, {TOKENIZE_KEY: True}, text_input="")["tokens"] == [1]
    assert ask(with_bos, {TOKENIZE_KEY: True, "add_special_tokens": False}, text_input="")["tokens"] == []


def test_detokenize_decodes_with_special_tokens(tokenizer):
    ids = tokenizer.encode("Numbers: 0 1 2") + [tokenizer.eos_token_id]
    eos = tokenizer.hf_tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
    assert ask(tokenizer, {DETOKENIZE_KEY: True}, prompt_token_ids=ids) == {"prompt": f"Numbers: 0 1 2{eos}"}


@pytest.mark.parametrize("parameters, inputs, words", [
    ({DETOKENIZE_KEY: True}, {"prompt_token_ids": [5, 10**6]}, "holds 1000000 at index 1; the vocabulary has"),
    ({DETOKENIZE_KEY: True}, {"prompt_token_ids": [-1]}, "holds -1 at index 0"),
    ({TOKENIZE_KEY: True, "add_special_tokens": 1}, {"text_input": "x"}, "'add_special_tokens' is not an option"),
    ({TOKENIZE_KEY: True, "echo": True}, {"text_input": "x"}, "'echo' is not an option"),
    ({TOKENIZE_KEY: True}, {"prompt_token_ids": [1]}, "is already tokenized"),
    ({DETOKENIZE_KEY: True}, {"text_input": "x"}, "input 'prompt_token_ids' is missing"),
    ({TOKENIZE_KEY: True}, {"messages": json.dumps([{"role": "user", "content": "a"}, {"role": "assistant",
                                                   "content": "b"}]),
                          "chat_template_kwargs": json.dumps({"continue_final_message": True,
                                                             "add_generation_prompt": True})},
     "continue_final_message"),
])
def test_bad_control_requests_are_refused_by_name(tokenizer, parameters, inputs, words):
    with pytest.raises(InvalidRequest) as refused:
        ask(tokenizer, parameters, **inputs)
    assert words in str(refused.value)
    assert code_from_message(str(refused.value)) == "INVALID_ARG"


def test_the_vocabulary_size_is_named(tokenizer):
    with pytest.raises(InvalidRequest, match=rf"has {tokenizer.vocab_size} tokens \(ids 0 to "):
        ask(tokenizer, {DETOKENIZE_KEY: True}, prompt_token_ids=[tokenizer.vocab_size])
