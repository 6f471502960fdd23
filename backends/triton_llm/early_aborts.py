"""Aborts by key that came before their request.

A caller aborts by key (ragstack_abort) as soon as its client leaves; a rag query's llm request may
not have reached the llm yet (it is still in embed, retrieval or rerank), and the abort finds nothing
to end. Its key is kept for TTL_S, and the request that arrives with it ends at once, cancelled,
instead of generating for nobody. Keys are the callers' fresh uuids, so a kept key names no other
request. Used from the model's event loop thread only.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

TTL_S = 60.0       # how long an abort waits for its request (seconds); a request later still generates
MAX_KEYS = 4096    # the oldest go first beyond it
MAX_KEY_CHARS = 128   # every caller's key is a uuid4's 32 hex digits; a longer one is not kept (anyone may abort)


class EarlyAborts:
    def __init__(self, ttl_s: float = TTL_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_keys, self._clock = ttl_s, max_keys, clock
        self._expiry: OrderedDict[str, float] = OrderedDict()   # in the order added: expiries ascending

    def add(self, key: str) -> None:
        if len(key) > MAX_KEY_CHARS:
            return
        now = self._clock()
        self._expiry.pop(key, None)
        self._expiry[key] = now + self.ttl_s
        while self._expiry and (len(self._expiry) > self.max_keys or next(iter(self._expiry.values())) < now):
            self._expiry.popitem(last=False)

    def take(self, key: str) -> bool:
        """Whether `key` was aborted within TTL_S; it is forgotten either way."""
        expiry = self._expiry.pop(key, None)
        return expiry is not None and expiry >= self._clock()

    def __len__(self) -> int:
        return len(self._expiry)
