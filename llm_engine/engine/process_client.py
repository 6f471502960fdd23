"""The EngineClient (client.py) of an engine in another process (engine_process.py): a private one,
its child, or one shared by several clients (engine_share.py).

Admitted requests go to the engine process over a connection (protocol.py); it answers each pass of
its loop with a StepReport of this client's requests, which a reader thread here hands to the
request streams. Receiving releases the GIL, and nothing the serving process does with it (Triton's
response sends wait for their IPC round trip) can stall the engine's step loop.

Private (no share): the client starts the engine over a socket pair; the engine exits when the
client shuts down or dies (child_process.py). Shared: under the share's lock the client joins the
engine listening at the share's socket, or starts one there; the engine serves until its last
client has left. Each client's shutdown (DETACH) and death end only its own requests.

If the engine process dies (killed, crashed), every open stream ends with EngineDeadError and every
later request is refused with it; a new client (a restart, a model reload) starts or joins another.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection

from llm_engine.child_process import TAIL_LINES, ChildProcess, log_tail
from llm_engine.config import EngineConfig
from llm_engine.engine.client import EngineClient
from llm_engine.engine.engine_loop import StepReport
from llm_engine.engine.engine_share import EngineShare, remove_stale
from llm_engine.engine.input_processor import EngineRequest
from llm_engine.engine.protocol import ABORT, ADD, CLOSED, DETACH, HELLO, NOTE, READY, REFUSED, STEP
from llm_engine.errors import EngineClosedError, EngineDeadError, EngineStartError
from llm_engine.model.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

EXIT_WAIT_S = 2.0      # for a process whose connection closed to finish exiting
START_TIMEOUT_S = 900.0  # loading, KV sizing, kernel compilation and graph capture of a large model
JOIN_TIMEOUT_S = 30.0  # for a running engine to answer a joining client
CLOSE_GRACE_S = 30.0   # beyond the shutdown timeout: the engine ends this client's requests and says CLOSED
MAX_BATCH = 64         # messages read at once before their outputs are handed over
QUOTED_LINES = 5       # of a dead engine's output, in the error every request gets
MODULE = "llm_engine.engine.engine_process"


class EngineProcessClient(EngineClient):
    def __init__(self, config: EngineConfig, start_timeout_s: float = START_TIMEOUT_S,
                 share: EngineShare | None = None, on_note: Callable[[object], None] | None = None) -> None:
        """Start the engine process and wait until it has warmed up, or with `share` join the engine
        there if one takes this client (EngineStartError if it fails or is not ready within
        `start_timeout_s`). `on_note`: called on the reader thread with each note another client of
        the engine sent (send_note)."""
        tokenizer = Tokenizer(config.model_config.path)
        self._on_note = on_note
        self._send_lock = threading.Lock()
        self._kill_reason: str | None = None
        self._child: ChildProcess | None = None   # the engine, when this client started it
        self._log = None                          # a shared engine's log file, open
        self._clients_left: int | None = None     # from CLOSED
        self.exporter = False                     # this client publishes the engine-wide metrics
        self.share = share
        if share is None:
            self._conn, stats, self._pid = self._start(config, None, start_timeout_s)
        else:
            with share.locked():
                joined = self._join(share)
                self._conn, stats, self._pid = joined or self._start(config, share, start_timeout_s)
        self.exporter = self._child is not None  # a new engine's first client is its oldest
        super().__init__(config, tokenizer, stats)
        self._reader = threading.Thread(target=self._read, name="llm-engine-reader", daemon=True)
        self._reader.start()

    def _start(self, config: EngineConfig, share: EngineShare | None, start_timeout_s: float):
        """A new engine process, this client its first: its connection, stats and pid once it is READY."""
        start = {"config": config}
        options = {}
        if share is not None:
            remove_stale(share.directory)
            share.socket_path.unlink(missing_ok=True)  # a dead engine's, or a full one's (it keeps its clients)
            share.log_path.unlink(missing_ok=True)
            start.update(listen=str(share.socket_path), max_clients=share.max_clients, log=str(share.log_path),
                         outlive_parent=True)
            options = {"args": share.label, "log_file": share.log_path}
        ours, theirs = socket.socketpair()
        try:
            self._child = ChildProcess(MODULE, {**start, "fd": theirs.fileno()}, "llm engine",
                                       pass_fds=(theirs.fileno(),), **options)
        finally:
            theirs.close()
        if share is not None:
            self._log = open(share.log_path, "rb")  # noqa: SIM115 - kept: a later engine may replace the path
            # A shared engine outlives this client when others still use it: leave it be.
            self._end_child = weakref.finalize(self, self._child.release)
        else:
            self._end_child = weakref.finalize(self, self._child.kill)  # also at interpreter exit
        conn = Connection(ours.detach())
        try:
            if not conn.poll(start_timeout_s):
                self._child.kill()
                raise EngineStartError(f"the engine process was not ready within {start_timeout_s:.0f} s; its last "
                                       f"output:\n{self._last_output()}")
            kind, stats, pid = conn.recv()
            assert kind == READY, kind
        except (EOFError, OSError):
            self._child.wait(EXIT_WAIT_S)
            self._child.kill()
            raise EngineStartError(f"the engine process {self._child.describe_exit()} while starting; "
                                   f"its last output:\n{self._last_output()}") from None
        except BaseException:
            self._child.kill()
            raise
        return conn, stats, pid

    def _join(self, share: EngineShare):
        """The engine listening at the share's socket, if it takes this client: its connection, stats
        and pid; None if nothing listens there or it refuses."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(share.socket_path))
        except OSError:  # no file (no engine yet), or a dead engine's
            sock.close()
            return None
        conn = Connection(sock.detach())
        try:
            log = open(share.log_path, "rb")  # noqa: SIM115 - kept for the engine's last output
        except OSError:
            log = None
        try:
            conn.send((HELLO,))
            if not conn.poll(JOIN_TIMEOUT_S):
                raise EngineStartError(f"the engine process at {share.socket_path} did not answer within "
                                       f"{JOIN_TIMEOUT_S:.0f} s")
            reply = conn.recv()
        except (EOFError, OSError):
            reply = (REFUSED, "it closed the connection")
        except BaseException:
            conn.close()
            if log is not None:
                log.close()
            raise
        if reply[0] != READY:
            logger.info("the engine at %s refused a client (%s): starting another", share.socket_path, reply[1])
            conn.close()
            if log is not None:
                log.close()
            return None
        self._log = log
        return conn, reply[1], reply[2]

    @property
    def pid(self) -> int:
        """The engine process's."""
        return self._pid

    @property
    def started_engine(self) -> bool:
        """Whether this client started its engine (the engine is its child)."""
        return self._child is not None

    def kill(self, reason: str) -> None:
        """End a stuck engine process at once (SIGKILL): its open requests fail with EngineDeadError
        giving `reason`, as do later ones (and those of the engine's other clients)."""
        self._kill_reason = reason
        if self._child is not None:
            self._child.kill()
        elif self.failure is None:  # still connected: the pid is still the engine's
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _submit(self, request: EngineRequest) -> None:
        self._send((ADD, request))

    def _send_abort(self, request_id: str) -> None:
        try:
            self._send((ABORT, request_id))
        except EngineDeadError:
            pass

    def send_note(self, note: object) -> None:
        """`note` (picklable) to the engine's other clients' `on_note`; nothing where there are none, or the
        engine is gone."""
        try:
            self._send((NOTE, note))
        except EngineDeadError:
            pass

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish for up to `timeout` seconds (None: no
        limit), abort the rest; the engine then ends this client. The last client's leaving closes
        the engine, and its process exits."""
        if self._begin_shutdown():
            try:
                self._send((DETACH, timeout))
            except EngineDeadError:
                pass
        self._reader.join(None if timeout is None else timeout + CLOSE_GRACE_S)
        if self._child is not None:
            if self.share is None or self._clients_left == 0 or self.failure is not None:
                # Private, or the last client: the engine closes and exits now.
                if self._child.wait(EXIT_WAIT_S) is None:
                    logger.warning("the engine process (pid %d) did not exit; killing it", self._child.pid)
                self._end_child()
                self._child.kill()
            else:
                self._end_child()  # others still use it: it exits after the last of them
        self._reader.join(EXIT_WAIT_S)
        self._conn.close()
        if self._log is not None:
            self._log.close()
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
        engine has closed this client."""
        steps = [message for message in batch if message[0] == STEP]
        if steps:
            reports = [message[1] for message in steps]
            last = reports[-1]
            self.exporter = steps[-1][2]
            self._take(StepReport([d for r in reports for d in r.deltas], [e for r in reports for e in r.errors],
                                  last.stats, last.num_adds_taken))
        for message in batch:
            if message[0] == NOTE and self._on_note is not None:
                self._on_note(message[1])
            if message[0] == CLOSED:
                self._clients_left = message[1]
                self.exporter = False
                return True
        return False

    def _died(self) -> None:
        if self._child is not None:
            code = self._child.wait(EXIT_WAIT_S)
            how = self._child.describe_exit() if code is not None else "closed its connection"
        else:  # not our child: its exit status is its starter's to see
            how = "closed its connection (it exited or was killed)"
        if self._kill_reason is not None:
            how = f"was killed: {self._kill_reason}"
        output = self._last_output(QUOTED_LINES).rstrip()
        failure = f"the engine process (pid {self._pid}) {how}; its last output: {output}"
        self.exporter = False
        if not self._closing:
            logger.error("%s", failure)
        self._fail(failure)

    def _last_output(self, lines: int = TAIL_LINES) -> str:
        if self._log is not None:
            return log_tail(self._log, lines)
        return self._child.last_output(lines) if self._child is not None else "(none)\n"
