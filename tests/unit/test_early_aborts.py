"""backends/triton_llm/early_aborts.py: an abort by key that came before its request is kept for its TTL,
taken once, and bounded in number."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends" / "triton_llm"))
from early_aborts import EarlyAborts  # noqa: E402


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_key_is_taken_once_within_its_ttl():
    clock = Clock()
    aborts = EarlyAborts(ttl_s=60, clock=clock)
    aborts.add("a")
    clock.now = 59.9
    assert aborts.take("a") and not aborts.take("a")
    assert not aborts.take("never aborted")


def test_an_expired_key_is_not_taken_and_is_dropped_by_later_adds():
    clock = Clock()
    aborts = EarlyAborts(ttl_s=60, clock=clock)
    aborts.add("old")
    clock.now = 30
    aborts.add("newer")
    clock.now = 61
    assert not aborts.take("old")
    aborts.add("old-again")   # expired keys leave as new ones come
    clock.now = 95
    aborts.add("latest")
    assert len(aborts) == 2 and aborts.take("old-again") and aborts.take("latest")


def test_the_oldest_keys_go_beyond_the_bound():
    aborts = EarlyAborts(max_keys=3, clock=Clock())
    for key in "abcd":
        aborts.add(key)
    assert len(aborts) == 3 and not aborts.take("a") and all(map(aborts.take, "bcd"))


def test_long_keys_are_not_kept():
    """Review 17: anyone may send an abort; 300 keys of 1 MB held 290 MiB in a stub for 60 s."""
    aborts = EarlyAborts(clock=Clock())
    aborts.add("k" * 129)
    aborts.add("u" * 32)
    assert len(aborts) == 1 and not aborts.take("k" * 129) and aborts.take("u" * 32)
