"""The EngineClient (client.py) of an engine in a child process (engine_process.py).

Admitted requests go to the engine process over a socket pair (protocol.py); it answers each pass
of its loop with a StepReport, which a reader thread here hands to the request streams. Receiving
releases the GIL, and nothing the serving process does with it (Triton's response sends hold it for
their IPC round trip) can stall the engine's step loop.

If the engine process dies (killed, crashed), every open stream ends with EngineDeadError and every
later request is refused with it; a new client (a model reload) starts a new process. The engine
process exits when this process dies (child_process.py).
"""
from __future__ import annotations

import logging
import socket
import threading
import weakref
from multiprocessing.connection import Connection

from llm_engine.child_process import ChildProcess
from llm_engine.config import EngineConfig
from llm_engine.engine.client import EngineClient
from llm_engine.engine.engine_loop import StepReport
from llm_engine.engine.input_processor import EngineRequest
from llm_engine.engine.protocol import ABORT, ADD, CLOSED, READY, SHUTDOWN, STEP
from llm_engine.errors import EngineClosedError, EngineDeadError, EngineStartError
from llm_engine.model.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0      # for a process whose connection closed to finish exiting
START_TIMEOUT_S = 900.0  # loading, KV sizing, kernel compilation and graph capture of a large model
CLOSE_GRACE_S = 30.0   # beyond the shutdown timeout: the engine closes (stops its workers) and exits
MAX_BATCH = 64         # messages read at once before their outputs are handed over
QUOTED_LINES = 5       # of a dead engine's output, in the error every request gets


class EngineProcessClient(EngineClient):
    def __init__(self, config: EngineConfig, start_timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the engine process and wait until it has warmed up (EngineStartError if it fails or
        is not ready within `start_timeout_s`)."""
        tokenizer = Tokenizer(config.model_config.path)
        self._send_lock = threading.Lock()
        self._kill_reason: str | None = None
        ours, theirs = socket.socketpair()
        try:
            self._child = ChildProcess("llm_engine.engine.engine_process", {"config": config, "fd": theirs.fileno()},
                                       "llm engine", pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._kill_child = weakref.finalize(self, self._child.kill)  # also at interpreter exit
        self._conn = Connection(ours.detach())
        try:
            if not self._conn.poll(start_timeout_s):
                self._kill_child()
                raise EngineStartError(f"the engine process was not ready within {start_timeout_s:.0f} s; its last "
                                       f"output:\n{self._child.last_output()}")
            kind, stats = self._conn.recv()
            assert kind == READY, kind
        except (EOFError, OSError):
            self._child.wait(EXIT_WAIT_S)
            self._kill_child()
            raise EngineStartError(f"the engine process {self._child.describe_exit()} while starting; "
                                   f"its last output:\n{self._child.last_output()}") from None
        except BaseException:
            self._kill_child()
            raise
        super().__init__(config, tokenizer, stats)
        self._reader = threading.Thread(target=self._read, name="llm-engine-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The engine process's."""
        return self._child.pid

    def kill(self, reason: str) -> None:
        """End a stuck engine process at once (SIGKILL): its open requests fail with EngineDeadError
        giving `reason`, as do later ones."""
        self._kill_reason = reason
        self._kill_child()

    def _submit(self, request: EngineRequest) -> None:
        self._send((ADD, request))

    def _send_abort(self, request_id: str) -> None:
        try:
            self._send((ABORT, request_id))
        except EngineDeadError:
            pass

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None: no
        limit), abort the rest; the engine process closes the engine and exits."""
        if self._begin_shutdown():
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
                self._take_all(batch)
                self._died()
                return
            if self._take_all(batch):
                return

    def _take_all(self, batch: list[tuple]) -> bool:
        """Hand the messages' reports over as one (one wake-up per event loop); True once the
        engine has closed."""
        reports = [message[1] for message in batch if message[0] == STEP]
        if reports:
            last = reports[-1]
            self._take(StepReport([d for r in reports for d in r.deltas], [e for r in reports for e in r.errors],
                                  last.stats, last.num_adds_taken))
        return any(message[0] == CLOSED for message in batch)

    def _died(self) -> None:
        code = self._child.wait(EXIT_WAIT_S)
        how = self._child.describe_exit() if code is not None else "closed its connection"
        if self._kill_reason is not None:
            how = f"was killed: {self._kill_reason}"
        output = self._child.last_output(QUOTED_LINES).rstrip()
        failure = f"the engine process (pid {self._child.pid}) {how}; its last output: {output}"
        if not self._closing:
            logger.error("%s", failure)
        self._fail(failure)
