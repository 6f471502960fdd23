"""The engine in a process of its own: `python -m llm_engine.engine.engine_process`, started by
EngineProcessClient (process_client.py), which serves the requests; several clients may share it.

Why: the serving process has threads that hold the GIL for long stretches (Triton's Python-backend
stub waits for each response's IPC round trip, ~0.2 ms); an engine loop among them stalls on every
one, and its host work (scheduling, step packing, detokenization) is the step's critical path. Here
the loop has an interpreter of its own. Why several clients: one stub sends its responses one at a
time, so the responses of many streams queue behind each other; several stubs (model instances),
each sending its own requests' responses, share one engine (docs/llm_model.md, "Response instances").

The start message (stdin, child_process.py) holds the EngineConfig and the number of this process's
end of a socket pair: its starter, the first client. A shared engine (engine_share.py) also gets a
Unix socket path and a log file: after warm-up it listens there for up to `max_clients - 1` more
clients over its life (the other instances of the same model load; a later load starts its own
engine), and it outlives its starter. The process builds the engine (tensor-parallel ranks 1.. are
its children), warms it up (every kernel variant compiled, CUDA graphs captured), says READY, and
runs the EngineLoop in its main thread. Each client has a thread that takes its messages into the
loop's inbox; after every pass the loop sends each client a STEP with its own requests' deltas
(protocol.py). A client that leaves (DETACH: its requests finish until its deadline, the
rest are aborted) or goes away (end of file: its requests are aborted at once) takes only its own
requests; when the last one has left, the engine closes (its workers stop) and the process exits.
A private engine (no socket) also exits at once when its starter's stdin closes. A failure to start
ends the process with the traceback on stderr, which the client quotes.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from multiprocessing.connection import Connection

import torch

from llm_engine.child_process import read_start_message
from llm_engine.config import EngineConfig
from llm_engine.engine.engine_loop import EngineLoop, StepReport
from llm_engine.engine.input_processor import EngineRequest
from llm_engine.engine.llm_engine import LLMEngine, start_engine
from llm_engine.engine.protocol import (ABORT, ADD, CLOSED, DETACH, HELLO, NOTE, READY, REFUSED, STEP,
                                         portable)

logger = logging.getLogger("llm_engine.engine.engine_process")

HELLO_TIMEOUT_S = 10.0  # for a connected client's HELLO


class _Client:
    """One client's connection and what the engine holds for it."""

    def __init__(self, number: int, conn: Connection) -> None:
        self.number = number                  # in joining order: the lowest live one is the exporter
        self.conn = conn
        self._send_lock = threading.Lock()
        self.requests: set[str] = set()       # forwarded to the loop, not finished
        self.pending_adds: deque[int] = deque()  # the sequence numbers of its adds the loop has not taken
        self.adds_taken = 0
        self.deadline: float | None = None    # set by DETACH
        self.gone = False                     # left (CLOSED sent) or went away

    def post(self, message: tuple) -> None:
        """Sent at once, from the caller's thread (the loop's, for STEP: no hand-over to another thread
        that would wait for the GIL); a client that is gone is its receiver's to notice."""
        with self._send_lock:
            if self.conn.closed:
                return
            try:
                self.conn.send(message)
            except OSError:
                pass

    def close(self) -> None:
        """Under the send lock: no send can reach the number a closed descriptor leaves for reuse."""
        with self._send_lock:
            self.conn.close()


class EngineServer:
    def __init__(self, engine: LLMEngine, conn: Connection, listen: str | None = None, max_clients: int = 1,
                 log: str | None = None) -> None:
        """`conn`: the starter's connection. `listen`: the Unix socket path where up to `max_clients - 1`
        more clients may join; `log`: the file its stderr goes to."""
        self.engine = engine
        self.loop = EngineLoop(engine, self._deliver)
        self._starter = conn
        self._listen_path = listen
        self._max_clients = max_clients
        self._log_path = log
        self._lock = threading.Lock()        # the clients, their requests, the add sequence
        self._clients: dict[int, _Client] = {}
        self._owner: dict[str, _Client] = {}
        self._joined = 0
        self._adds_sent = 0                  # adds handed to the loop, all clients; numbers them
        self._closing = False
        self._listener: socket.socket | None = None

    def serve(self) -> None:
        """READY to the starter, the loop until the last client has left, the engine closed (its
        workers stopped), then CLOSED to whoever is still connected."""
        if self._listen_path is not None:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(self._listen_path)
            self._listener.listen(16)
        starter = self._join(self._starter)
        starter.post((READY, self.engine.get_stats(), os.getpid()))
        if self._listener is not None:
            threading.Thread(target=self._accept, name="engine-accept", daemon=True).start()
        self.loop.run()
        self.engine.close()
        with self._lock:
            self._closing = True
            left = [c for c in self._clients.values() if not c.gone]
        for client in left:
            self._finish(client)
        self._stop_listening()
        self._remove_log()

    def _remove_log(self) -> None:
        """A shared engine's log file, after a clean close, if the path is still its own (its stderr):
        no client quotes it any more (the starter relayed it while it lived)."""
        if self._log_path is None:
            return
        try:
            if os.stat(self._log_path).st_ino == os.fstat(2).st_ino:
                os.unlink(self._log_path)
        except OSError:
            pass

    # --- clients joining and leaving ------------------------------------------------------------

    def _join(self, conn: Connection) -> _Client:
        with self._lock:
            self._joined += 1
            client = _Client(self._joined, conn)
            self._clients[client.number] = client
        threading.Thread(target=self._receive, args=(client,), name=f"engine-inbox-{client.number}",
                         daemon=True).start()
        return client

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            threading.Thread(target=self._greet, args=(Connection(sock.detach()),), name="engine-greet",
                             daemon=True).start()

    def _greet(self, conn: Connection) -> None:
        """A connected client's HELLO: it joins (READY), or is REFUSED when the engine took its
        `max_clients` or is closing."""
        try:
            if not conn.poll(HELLO_TIMEOUT_S) or conn.recv()[0] != HELLO:
                conn.close()
                return
            with self._lock:
                refusal = ("the engine is closing" if self._closing else
                           f"the engine took its {self._max_clients} clients" if self._joined >= self._max_clients
                           else None)
            if refusal is not None:
                conn.send((REFUSED, refusal))
                conn.close()
                return
        except (EOFError, OSError):
            conn.close()
            return
        client = self._join(conn)
        client.post((READY, self.engine.get_stats(), os.getpid()))

    def _receive(self, client: _Client) -> None:
        while True:
            try:
                message = client.conn.recv()
            except (EOFError, OSError):
                self._went_away(client)
                return
            kind = message[0]
            if kind == ADD:
                self._add(client, message[1])
            elif kind == ABORT:
                with self._lock:
                    owned = self._owner.get(message[1]) is client
                if owned:
                    self.loop.abort(message[1])
            elif kind == DETACH:
                self._detach(client, message[1])
            elif kind == NOTE:
                with self._lock:
                    others = [c for c in self._clients.values() if c is not client and not c.gone]
                for other in others:
                    other.post(message)

    def _add(self, client: _Client, request: EngineRequest) -> None:
        with self._lock:
            if request.request_id in self._owner:
                client.adds_taken += 1  # refused here: never reaches the loop
                error = ValueError(f"request_id {request.request_id!r} is already in use in the engine")
                client.post((STEP, StepReport([], [(request.request_id, error)], self.engine.get_stats(),
                                              client.adds_taken), False))
                return
            self._adds_sent += 1
            self._owner[request.request_id] = client
            client.requests.add(request.request_id)
            client.pending_adds.append(self._adds_sent)
            self.loop.add(request)  # in the order of the numbers: the loop's count of adds taken follows them

    def _detach(self, client: _Client, timeout: float | None) -> None:
        """The client leaves: its requests run until the deadline (checked after every pass), then are aborted."""
        with self._lock:
            client.deadline = math.inf if timeout is None else time.monotonic() + timeout
            done = not client.requests
        if done:
            self._finish(client)

    def _went_away(self, client: _Client) -> None:
        """End of file: the client closed its connection (after CLOSED) or died. Its requests are aborted."""
        with self._lock:
            was_gone, client.gone = client.gone, True
            requests = list(client.requests)
            self._clients.pop(client.number, None)
            empty = not self._clients
        client.close()
        if not was_gone:
            for request_id in requests:
                self.loop.abort(request_id)
        if empty:
            self._close_if_empty()

    def _finish(self, client: _Client) -> None:
        """CLOSED to a client whose requests are over; it closes its end, which ends its receiver."""
        with self._lock:
            if client.gone:
                return
            client.gone = True
            self._clients.pop(client.number, None)
            left = len(self._clients)
            if not left and self._listener is None:
                self._closing = True
        client.post((CLOSED, left))
        if not left:
            self._close_if_empty()

    def _close_if_empty(self) -> None:
        """The last client has left: unless one joined meanwhile, stop listening and close the loop. A
        client whose HELLO comes after this is refused (and starts an engine of its own); one that joined
        before keeps the engine serving."""
        with self._lock:
            if self._clients:
                return
            self._closing = True
        self._stop_listening()
        self.loop.close(0)

    def _stop_listening(self) -> None:
        """Close the listener: connecting to its path is refused from now on. The path stays until the
        next engine's starter replaces it (under the clients' lock, which the engine never waits for)."""
        if self._listener is None:
            return
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    # --- the loop's thread ----------------------------------------------------------------------

    def _deliver(self, report: StepReport) -> None:
        """A pass of the loop: each client's deltas and errors to it, with the stats; deadlines checked."""
        stats = report.stats
        now = time.monotonic()
        overdue: list[str] = []
        finished: list[_Client] = []
        with self._lock:
            clients = [c for c in self._clients.values() if not c.gone]
            parts: dict[int, tuple[list, list]] = {c.number: ([], []) for c in clients}
            for delta in report.deltas:
                owner = self._owner.get(delta.request_id)
                if owner is None:
                    continue
                if delta.finished:
                    del self._owner[delta.request_id]
                    owner.requests.discard(delta.request_id)
                if owner.number in parts:
                    parts[owner.number][0].append(delta)
            for request_id, exc in report.errors:
                owner = self._owner.pop(request_id, None)
                if owner is None:
                    continue
                owner.requests.discard(request_id)
                if owner.number in parts:
                    parts[owner.number][1].append((request_id, portable(exc)))
            staying = [c for c in clients if c.deadline is None]
            exporter = min(staying or clients, key=lambda c: c.number, default=None)
            for client in clients:
                while client.pending_adds and client.pending_adds[0] <= report.num_adds_taken:
                    client.pending_adds.popleft()
                    client.adds_taken += 1
                if client.deadline is not None:
                    if not client.requests:
                        finished.append(client)
                    elif now >= client.deadline:
                        overdue += client.requests
        for client in clients:
            deltas, errors = parts[client.number]
            client.post((STEP, StepReport(deltas, errors, stats, client.adds_taken), client is exporter))
        for request_id in overdue:
            self.loop.abort(request_id)
        for client in finished:
            self._finish(client)


def torch_threads(config: EngineConfig) -> int:
    """Torch's threads in the engine process. On the CPU: the cores this process may use, less one for the
    serving process (its response thread, the server), shared by the tensor-parallel ranks; an OpenMP team
    that spans every core stalls at each barrier once the serving process preempts one of its threads (on
    2 cores, steps of ~2 ms took up to 250 ms). On a GPU: one, as the host work is a step's small input
    tensors; a team per core spun 15 threads at 27% of a core each behind 8 instances at 256 streams (an
    H100's 16 cores), and the step's ITL p50 rose from 16.7 to 27.9 ms."""
    if config.torch_device.type != "cpu":
        return 1
    return max(1, (len(os.sched_getaffinity(0)) - 1) // config.tensor_parallel_size)


def main() -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    start = read_start_message()
    config = start["config"]
    torch.set_num_threads(torch_threads(config))
    conn = Connection(start["fd"])
    EngineServer(start_engine(config), conn, listen=start.get("listen"), max_clients=start.get("max_clients", 1),
                 log=start.get("log")).serve()


if __name__ == "__main__":
    main()
