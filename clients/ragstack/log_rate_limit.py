"""A logging filter for servers whose clients can make them log: at most LOG_BURST records per LOG_WINDOW_S,
the count of those left out logged after (the gateway: aiohttp logs each malformed request; the OpenAI
frontend: uvicorn logs each one, and asyncio each accept that fails for want of file descriptors)."""
from __future__ import annotations

import logging
import time

LOG_BURST, LOG_WINDOW_S = 20, 10.0


class RateLimit(logging.Filter):
    """At most LOG_BURST records per LOG_WINDOW_S; the count of those left out is logged after."""

    def __init__(self):
        super().__init__()
        self.window_start, self.passed, self.dropped = time.monotonic(), 0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.window_start >= LOG_WINDOW_S:
            if self.dropped:
                record.msg = f"({self.dropped} log records left out in the last {LOG_WINDOW_S:g} s) {record.msg}"
            self.window_start, self.passed, self.dropped = now, 0, 0
        self.passed += 1
        if self.passed > LOG_BURST:
            self.dropped += 1
            return False
        return True
