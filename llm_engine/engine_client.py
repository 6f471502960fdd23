"""AsyncLLMEngine's interface over an engine in a child process (engine_process.py).

The front end stays in the serving process: it validates and tokenizes each request (processor.py:
bad input raises at once in add_request), keeps the count of waiting requests for max_waiting, and
sends the request over a socket pair. The engine process answers with one message per step holding
all that step's outputs as deltas and the engine's stats; a reader thread here rebuilds the outputs
and hands them to each request's event loop (streams.py: outputs that queue up behind a slow
consumer merge into one), and keeps the latest stats for get_stats(). Receiving releases the GIL,
and nothing the serving process does with it (Triton's response sends hold it for their IPC round
trip) can stall the engine's step loop.

If the engine process dies (killed, crashed), every open stream ends with EngineDeadError and every
later request is refused with it; a new client (a model reload) starts a new process. The engine
process exits when this process dies (child_process.py).
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import weakref
from multiprocessing.connection import Connection
from typing import AsyncIterator

from llm_engine.child_process import ChildProcess
from llm_engine.config import EngineConfig
from llm_engine.engine_protocol import (ABORT, ADD, CLOSED, READY, SHUTDOWN, STEP, OutputAssembler)
from llm_engine.outputs import EngineClosedError, EngineStats, RequestOutput
from llm_engine.processor import InputProcessor
from llm_engine.sampling_params import SamplingParams
from llm_engine.scheduler import EngineOverloadedError
from llm_engine.streams import OutputStreams
from llm_engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0      # for a process whose connection closed to finish exiting
CLOSE_GRACE_S = 30.0   # beyond the shutdown timeout: the engine closes (stops its workers) and exits
MAX_BATCH = 64         # messages read at once before their outputs are handed over
QUOTED_LINES = 5       # of a dead engine's output, in the error every request gets


class EngineStartError(RuntimeError):
    """The engine process failed to start; the message quotes its last output."""


class EngineDeadError(EngineClosedError):
    """The engine process exited while serving."""


class EngineProcessClient:
    def __init__(self, config: EngineConfig) -> None:
        """Start the engine process and wait until it has warmed up (EngineStartError if it fails)."""
        self.config = config
        self.processor = InputProcessor(Tokenizer(config.model_config.path), config.max_model_len,
                                        config.model_config.vocab_size)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._streams = OutputStreams(self.abort)
        self._requests: dict[str, OutputAssembler] = {}
        self._closing = False
        self._failure: str | None = None  # why the engine process is gone
        self._adds_sent = 0
        self._adds_done = 0
        ours, theirs = socket.socketpair()
        try:
            self._child = ChildProcess("llm_engine.engine_process", {"config": config, "fd": theirs.fileno()},
                                       "llm engine", pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._kill_child = weakref.finalize(self, self._child.kill)  # also at interpreter exit
        self._conn = Connection(ours.detach())
        try:
            kind, self._stats = self._conn.recv()
            assert kind == READY, kind
        except (EOFError, OSError):
            self._child.wait(EXIT_WAIT_S)
            self._kill_child()
            raise EngineStartError(f"the engine process {self._child.describe_exit()} while starting; "
                                   f"its last output:\n{self._child.last_output()}") from None
        except BaseException:
            self._kill_child()
            raise
        self._reader = threading.Thread(target=self._read, name="llm-engine-reader", daemon=True)
        self._reader.start()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.processor.tokenizer

    @property
    def pid(self) -> int:
        """The engine process's."""
        return self._child.pid

    # --- AsyncLLMEngine's interface -----------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None,
                    prompt_token_ids: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """As AsyncLLMEngine.add_request; EngineDeadError (an EngineClosedError) once the engine
        process is gone."""
        request = self.processor.process(request_id, prompt, sampling_params, prompt_token_ids)
        queue = self._streams.open(request_id)
        try:
            with self._lock:
                if self._failure is not None:
                    raise EngineDeadError(self._failure)
                if self._closing:
                    raise EngineClosedError("the engine is shutting down")
                max_waiting = self.config.max_waiting
                queued = self._stats.num_waiting + self._adds_sent - self._adds_done
                if max_waiting is not None and queued >= max_waiting:
                    raise EngineOverloadedError(f"waiting queue is full (max_waiting={max_waiting}); retry later")
                self._requests[request_id] = OutputAssembler(request)
                self._adds_sent += 1
            self._send((ADD, request))
        except BaseException:
            self._streams.discard(request_id)
            with self._lock:
                self._requests.pop(request_id, None)
            raise
        return self._streams.iterate(request_id, queue)

    def abort(self, request_id: str) -> None:
        """Abort the request (no-op if finished); it is freed before the engine's next step."""
        with self._lock:
            if request_id not in self._requests:
                return
        try:
            self._send((ABORT, request_id))
        except EngineDeadError:
            pass

    def get_stats(self) -> EngineStats:
        """The stats after the engine's latest step (no round trip)."""
        with self._lock:
            return self._stats

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None: no
        limit), abort the rest; the engine process closes the engine and exits."""
        with self._lock:
            first, self._closing = not self._closing, True
        if first:
            try:
                self._send((SHUTDOWN, timeout))
            except EngineDeadError:
                pass
        self._reader.join(None if timeout is None else timeout + CLOSE_GRACE_S)
        if self._child.wait(EXIT_WAIT_S) is None:
            logger.warning("the engine process (pid %d) did not exit; killing it", self._child.pid)
        self._kill_child()
        self._reader.join(EXIT_WAIT_S)
        self._conn.close()
        self._streams.fail_all(lambda: EngineClosedError("the engine was shut down"))

    # --- the connection -----------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except OSError as exc:
            raise EngineDeadError(self._failure or f"the engine process is gone ({exc})") from None

    def _read(self) -> None:
        while True:
            batch = []
            try:
                batch.append(self._conn.recv())
                while len(batch) < MAX_BATCH and self._conn.poll():
                    batch.append(self._conn.recv())
            except (EOFError, OSError):
                self._take(batch)
                self._died()
                return
            if self._take(batch):
                return

    def _take(self, batch: list[tuple]) -> bool:
        """Hand the messages' outputs over; True once the engine has closed."""
        outputs, errors, closed = [], [], False
        with self._lock:
            for message in batch:
                if message[0] == STEP:
                    _, deltas, failed, self._stats, self._adds_done = message
                    for delta in deltas:
                        request = self._requests.get(delta[0])
                        if request is None:
                            continue
                        out = request.apply(delta)
                        if out.finished:
                            del self._requests[out.request_id]
                        outputs.append(out)
                    errors += [(rid, exc) for rid, exc in failed if self._requests.pop(rid, None) is not None]
                elif message[0] == CLOSED:
                    closed = True
        self._streams.deliver(outputs, errors)
        return closed

    def _died(self) -> None:
        code = self._child.wait(EXIT_WAIT_S)
        how = self._child.describe_exit() if code is not None else "closed its connection"
        output = self._child.last_output(QUOTED_LINES).rstrip()
        failure = (f"the engine process (pid {self._child.pid}) {how}; unload and load the model to restart it; "
                   f"its last output: {output}")
        with self._lock:
            self._failure = failure
            self._requests.clear()
            self._stats = dataclasses.replace(self._stats, kv_blocks_used=0, kv_blocks_free=self._stats.kv_blocks_total,
                                              num_running=0, num_waiting=0)
        if not self._closing:
            logger.error("%s", failure)
        self._streams.fail_all(lambda: EngineDeadError(failure))
