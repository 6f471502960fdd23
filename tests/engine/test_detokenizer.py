import random

import pytest
from conftest import CLEANUP_WORDS, ByteTokenizer
from tiny_checkpoints import tiny_checkpoints  # noqa: F401

from llm_engine.engine.detokenizer import IncrementalDetokenizer
from llm_engine.model.tokenizer import Tokenizer


@pytest.fixture
def tok(byte_tokenizer):
    return byte_tokenizer


def feed(tok, text_or_ids, stop=(), check_stop=True, **kw):
    """Feed tokens one by one; return (deltas, detokenizer)."""
    ids = tok.encode(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
    d = IncrementalDetokenizer(tok, tok.encode("prompt: "), list(stop), **kw)
    deltas = []
    for t in ids:
        d.add_token(t, check_stop=check_stop)
        deltas.append(d.emit())
        if d.stopped:
            break
    return deltas, d


def test_multibyte_characters_are_emitted_whole(tok):
    text = "héllo 世界 🎉!"
    deltas, d = feed(tok, text)
    assert all("\ufffd" not in piece for piece in deltas)
    assert "".join(deltas) == text == d.text
    # the 4-byte emoji arrives in one piece, after its last byte
    assert "🎉" in deltas


def test_pending_partial_character_is_flushed_at_the_end(tok):
    deltas, d = feed(tok, list("ab".encode()) + list("世".encode())[:2])
    assert "".join(deltas) == "ab"
    assert d.emit(finished=True) == "\ufffd"


def test_stop_string_truncates_and_stops(tok):
    deltas, d = feed(tok, "hello STOP world", stop=["STOP"])
    assert d.stopped and d.text == "hello " and "".join(deltas) == "hello "
    assert d.emit(finished=True) == ""


def test_text_that_may_start_a_stop_string_is_held_back(tok):
    deltas, d = feed(tok, "ab ST", stop=["STOP"])
    assert "".join(deltas) == "ab "
    d.add_token(ord("x"))
    assert d.emit() == "STx" and not d.stopped


def test_held_back_text_is_released_when_the_request_ends_otherwise(tok):
    deltas, d = feed(tok, "ab ST", stop=["STOP"])
    assert "".join(deltas) + d.emit(finished=True) == "ab ST"


def test_earliest_of_several_stop_strings_wins(tok):
    _, d = feed(tok, "one, two. three", stop=[".", ","])
    assert d.text == "one"


def test_stop_string_spanning_tokens_and_multibyte(tok):
    _, d = feed(tok, "abc 世界 def", stop=["世界"])
    assert d.stopped and d.text == "abc "


def test_stop_strings_are_ignored_below_min_tokens(tok):
    deltas, d = feed(tok, "a STOP b", stop=["STOP"], check_stop=False)
    assert not d.stopped and "".join(deltas) + d.emit(finished=True) == "a STOP b"


def test_the_stop_string_that_ended_the_text_is_named(tok):
    _, d = feed(tok, "one, two. three", stop=[".", ","])
    assert d.stop_string == ","
    _, d = feed(tok, "no stop here", stop=["."])
    assert not d.stopped and d.stop_string is None


def test_include_stop_str_in_output_keeps_the_stop_string_and_holds_nothing_back(tok):
    """As vLLM: the text ends with the stop string; what could begin one is shown as it comes (it is
    shown either way), and a stop string begun in text already shown still ends it."""
    deltas, d = feed(tok, "hello STOP world", stop=["STOP"], include_stop_str_in_output=True)
    assert deltas == list("hello STOP") and d.text == "hello STOP" and d.stop_string == "STOP"
    assert d.emit(finished=True) == ""
    deltas, d = feed(tok, "ab ST", stop=["STOP"], include_stop_str_in_output=True)
    assert "".join(deltas) == "ab ST" and not d.stopped


def test_include_stop_str_in_output_with_several_stop_strings_and_below_min_tokens(tok):
    _, d = feed(tok, "one, two. three", stop=[".", ","], include_stop_str_in_output=True)
    assert d.text == "one," and d.stop_string == ","
    deltas, d = feed(tok, "a STOP b", stop=["STOP"], check_stop=False, include_stop_str_in_output=True)
    assert not d.stopped and "".join(deltas) + d.emit(finished=True) == "a STOP b"


def test_special_tokens_are_skipped_or_kept(tok):
    ids = tok.encode("hi") + [tok.eos_token_ids[0]] + tok.encode("!")
    deltas, _ = feed(tok, ids)
    assert "".join(deltas) == "hi!"
    deltas, _ = feed(tok, ids, skip_special_tokens=False)
    assert "".join(deltas) == "hi</s>!"


@pytest.mark.parametrize("name", ["bytes", "tiny-llama", "tiny-mistral", "tiny-qwen2"])
def test_add_tokens_gives_the_text_of_add_token_one_by_one(tiny_checkpoints, name):  # noqa: F811
    """Deferred detokenization (requests reporting only their final output) decodes in one window;
    "bytes" splits multibyte characters over tokens."""
    tok = ByteTokenizer() if name == "bytes" else Tokenizer(tiny_checkpoints[name])
    rng = random.Random(1)
    for _ in range(100):
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 8))]
        out = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 40))]
        for skip in (True, False):
            one, bulk = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip), \
                IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
            streamed = ""
            for t in out:
                one.add_token(t)
                streamed += one.emit()
            streamed += one.emit(finished=True)
            split = rng.randint(0, len(out))  # a part fed at once, then the rest
            bulk.add_tokens(out[:split])
            bulk.add_tokens(out[split:])
            assert bulk.emit(finished=True) == streamed == one.text


def test_add_tokens_refuses_stop_strings():
    detok = IncrementalDetokenizer(ByteTokenizer(), [], stop=["x"])
    with pytest.raises(ValueError, match="stop strings"):
        detok.add_tokens([1, 2])


def test_a_clean_up_tokenizer_streams_the_text_of_its_bulk_decode(cleanup_tokenizer_dir):
    """transformers' clean-up looks across tokens (" ' " -> "'" needs the token after the quote):
    text streamed token by token, or fed in two parts, is the bulk decode's."""
    tok = Tokenizer(cleanup_tokenizer_dir)
    prompt = tok.encode("a", add_special_tokens=False)
    rng = random.Random(2)
    for _ in range(500):
        out = [rng.randrange(2, len(CLEANUP_WORDS)) for _ in range(rng.randint(1, 12))]
        want = tok.decode(prompt + out)[len(tok.decode(prompt)):]
        one_by_one = IncrementalDetokenizer(tok, prompt)
        streamed = ""
        for t in out:
            one_by_one.add_token(t)
            streamed += one_by_one.emit()
        streamed += one_by_one.emit(finished=True)
        bulk = IncrementalDetokenizer(tok, prompt)
        split = rng.randint(0, len(out))
        bulk.add_tokens(out[:split])
        bulk.add_tokens(out[split:])
        assert streamed == want == bulk.emit(finished=True), [CLEANUP_WORDS[i] for i in out]


def test_a_clean_up_tokenizer_still_cuts_at_stop_strings(cleanup_tokenizer_dir):
    tok = Tokenizer(cleanup_tokenizer_dir)
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False), stop=["c!"])
    text = ""
    for t in tok.encode("b . c ! a", add_special_tokens=False):
        d.add_token(t)
        text += d.emit()
        if d.stopped:
            break
    assert d.stopped and text + d.emit(finished=True) == " b. "


@pytest.mark.parametrize("include, text", [(False, " b"), (True, " bn'")])
def test_a_stop_string_inside_a_token_cuts_before_it_or_just_after_it(cleanup_tokenizer_dir, include, text):
    """The token "n't" holds the stop string "n'": with include_stop_str_in_output the text keeps it,
    and the rest of the token ("t") goes."""
    tok = Tokenizer(cleanup_tokenizer_dir)
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False), stop=["n'"],
                               include_stop_str_in_output=include)
    shown = ""
    for word in ("b", "n't", "c"):
        d.add_token(CLEANUP_WORDS.index(word))
        shown += d.emit()
        if d.stopped:
            break
    assert d.stop_string == "n'" and shown + d.emit(finished=True) == text == d.text


def test_a_clean_up_tokenizer_finds_a_stop_string_in_text_held_for_the_clean_up(cleanup_tokenizer_dir):
    """" s" waits for the clean-up (a later token could join it into a pattern), but a stop string
    in it ends the output at once: the engine learns of the stop on the token that completed it."""
    tok = Tokenizer(cleanup_tokenizer_dir)
    b, s = tok.encode("b s", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False))
    d.add_token(b)
    assert d.emit() == " b"
    d.add_token(s)
    assert d.emit() == ""  # held: no stop strings, nothing to decide yet
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False), stop=["s"])
    d.add_token(b)
    assert d.emit() == " b"
    d.add_token(s)
    assert d.stopped and d.emit() == " "
    assert d.emit(finished=True) == "" and d.text == " b "
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False), stop=["x"])
    d.add_token(b)
    d.add_token(s, last=True)  # the request's last token releases everything
    assert not d.stopped and d.emit() == " b s"


def test_a_clean_up_tokenizer_ignores_stop_strings_in_text_from_below_min_tokens(cleanup_tokenizer_dir):
    """" s" came below min_tokens and waits for the clean-up; released later, it is still text that
    stop strings do not apply to."""
    tok = Tokenizer(cleanup_tokenizer_dir)
    b, s, c = tok.encode("b s c", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, tok.encode("a", add_special_tokens=False), stop=["s"])
    d.add_token(b, check_stop=False)
    d.add_token(s, check_stop=False)
    d.add_token(c)
    assert not d.stopped and d.emit(finished=True) == " b s c"
