"""The OpenAI API key, from $RAGSTACK_OPENAI_API_KEY or a file: stripped alike (a Secret's or a file's
trailing newline), refused alike when it is not one word."""
from __future__ import annotations

import pytest

from ragstack.openai_frontend import keys


@pytest.mark.parametrize("where", ["environment", "file"])
def test_a_key_is_stripped_and_must_be_one_word(where, tmp_path, monkeypatch):
    def key(value: str) -> str | None:
        if where == "environment":
            monkeypatch.setenv(keys.ENV, value)
            return keys.api_key(None)
        (tmp_path / "key").write_text(value)
        return keys.api_key(tmp_path / "key")

    assert key("sk-0123456789\n") == "sk-0123456789"
    for bad in ("two words", " \n"):
        with pytest.raises(ValueError, match="must hold one key, without spaces"):
            key(bad)


def test_no_key_leaves_the_api_open(monkeypatch):
    monkeypatch.delenv(keys.ENV, raising=False)
    assert keys.api_key(None) is None
    monkeypatch.setenv(keys.ENV, "")
    assert keys.api_key(None) is None
