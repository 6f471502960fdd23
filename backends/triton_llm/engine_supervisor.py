"""The llm's engine, kept serving: a watchdog thread notices an engine that died (its process exited
or was killed) or stopped reporting (a hung step, a stopped process: its loop reports after every
step and every second when idle), fails its open requests with UNAVAILABLE naming the cause, and
starts a new engine process. Requests that arrive meanwhile are refused with UNAVAILABLE saying so.
An engine in the stub's own thread (engine_process false) cannot be restarted: its requests fail and
the message asks for a reload. Only the supervisor swaps engines; callers take `engine()` per request.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from llm_engine.engine.client import EngineClient
from llm_engine.errors import EngineClosedError
from llm_engine.outputs import EngineStats

CHECK_INTERVAL_S = 0.5
RESTART_WINDOW_S = 600.0  # at most `max_restarts` restarts within this window, then a reload is needed
RETRY_AFTER_FAILED_START_S = 5.0


class EngineSupervisor:
    def __init__(self, start: Callable[[], EngineClient], restartable: bool, stall_timeout_s: float,
                 max_restarts: int, log: Callable[[str], None]) -> None:
        """Starts the first engine (its failure fails the caller: the model does not load)."""
        self._start = start
        self._restartable = restartable
        self._stall_timeout_s = stall_timeout_s
        self._max_restarts = max_restarts
        self._log = log
        self._client = start()
        self.tokenizer = self._client.tokenizer
        self._restarting: str | None = None  # why a new engine is starting
        self._restarts: deque[float] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="triton_llm-watchdog", daemon=True)
        self._thread.start()

    def engine(self) -> EngineClient:
        """The engine to send a request to; EngineClosedError (UNAVAILABLE) while a new one starts."""
        reason = self._restarting
        if reason is not None:
            raise EngineClosedError(f"the engine is restarting after a failure ({reason}); retry in a few seconds")
        return self._client

    def recovery(self) -> str:
        """What follows an engine's death, for the requests it failed."""
        if self._restartable and self._restarts_left() > 0:
            return "a new engine is starting: retry in a few seconds"
        return "unload and load the model to start a new engine"

    def get_stats(self) -> EngineStats:
        return self._client.get_stats()

    def exports_engine_metrics(self) -> bool:
        """Whether this instance publishes the engine-wide metrics (KV blocks, running and waiting
        requests, ...): an engine shared by several instances names one, its oldest client; an
        engine of one instance (or in the stub) is that instance's."""
        return getattr(self._client, "exporter", True) and self._client.failure is None

    def shutdown(self, timeout: float | None) -> None:
        """Stop watching (a restart under way finishes first) and shut the engine down: requests run
        for up to `timeout` seconds, then each ends with an abort."""
        self._stop.set()
        self._thread.join()
        self._client.shutdown(timeout=timeout)

    def _watch(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL_S):
            client = self._client
            silent = client.seconds_since_report()
            if client.failure is None and silent > self._stall_timeout_s:
                client.kill(f"its step loop reported nothing for {silent:.0f} s (engine_stall_timeout_s "
                            f"{self._stall_timeout_s:g})")
                self._log(f"triton_llm: engine stalled for {silent:.0f} s: killed it")
            if client.failure is not None and self._restartable and not self._stop.is_set():
                self._restart(client)

    def _restarts_left(self) -> int:
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        return self._max_restarts - len(self._restarts)

    def _restart(self, failed: EngineClient) -> None:
        if self._restarts_left() <= 0:
            return  # the failed engine refuses every request with its failure; a reload starts afresh
        self._restarts.append(time.monotonic())
        self._restarting = failed.failure
        self._log(f"triton_llm: restarting the engine ({len(self._restarts)} of {self._max_restarts} restarts "
                  f"allowed in {RESTART_WINDOW_S:.0f} s) after: {failed.failure}")
        failed.shutdown(timeout=0)
        while not self._stop.is_set():
            try:
                self._client = self._start()
                break
            except Exception as exc:  # noqa: BLE001 - keep trying while the model is loaded
                self._log(f"triton_llm: the new engine failed to start ({exc}); retrying in "
                          f"{RETRY_AFTER_FAILED_START_S:.0f} s")
                self._stop.wait(RETRY_AFTER_FAILED_START_S)
        self._restarting = None
        if not self._stop.is_set():
            self._log("triton_llm: the engine was restarted and serves again")
