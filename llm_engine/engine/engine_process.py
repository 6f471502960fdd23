"""The engine in a process of its own: `python -m llm_engine.engine.engine_process`, started by
EngineProcessClient (process_client.py), which serves the requests.

Why: the serving process has threads that hold the GIL for long stretches (Triton's Python-backend
stub holds it for each response's IPC round trip, ~1 ms); an engine loop among them stalls on every
one, and its host work (scheduling, step packing, detokenization) is the step's critical path. Here
the loop has an interpreter of its own.

The start message (stdin, child_process.py) holds the EngineConfig and the number of this process's
end of a socket pair. The process builds the engine (tensor-parallel ranks 1.. are its children),
warms it up (every kernel variant compiled, CUDA graphs captured), says READY, and runs the
EngineLoop in its main thread, one STEP message per pass (protocol.py); a reader thread
takes the front end's messages into the loop's inbox. End of file on the socket or on stdin means
the front end is gone: the process exits at once. A failure to start ends it with the traceback on
stderr, which the front end quotes.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from multiprocessing.connection import Connection

import torch

from llm_engine.child_process import read_start_message
from llm_engine.config import EngineConfig
from llm_engine.engine.engine_loop import EngineLoop, StepReport
from llm_engine.engine.llm_engine import LLMEngine, start_engine
from llm_engine.engine.protocol import ABORT, ADD, CLOSED, READY, SHUTDOWN, STEP, portable

logger = logging.getLogger("llm_engine.engine.engine_process")


class EngineServer:
    def __init__(self, engine: LLMEngine, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self.loop = EngineLoop(engine, self._deliver)
        self._send_lock = threading.Lock()
        self._closed = False

    def serve(self) -> None:
        """READY, the loop until shut down, the engine closed (its workers stopped), CLOSED."""
        self._send((READY, self.engine.get_stats()))
        threading.Thread(target=self._receive, name="engine-inbox", daemon=True).start()
        self.loop.run()
        self.engine.close()
        self._closed = True
        self._send((CLOSED,))

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _deliver(self, report: StepReport) -> None:
        errors = [(rid, portable(exc)) for rid, exc in report.errors]
        self._send((STEP, dataclasses.replace(report, errors=errors)))

    def _receive(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                if not self._closed:
                    os._exit(1)  # the client is gone: nobody to serve
                return
            kind = message[0]
            if kind == ADD:
                self.loop.add(message[1])
            elif kind == ABORT:
                self.loop.abort(message[1])
            elif kind == SHUTDOWN:
                self.loop.close(message[1])


def cpu_threads(config: EngineConfig) -> int | None:
    """Torch threads for an engine on the CPU: the cores this process may use, less one for the serving
    process (its response thread, the server), shared by the tensor-parallel ranks. An OpenMP team that
    spans every core stalls at each barrier once the serving process preempts one of its threads (on
    2 cores, steps of ~2 ms took up to 250 ms). None on a GPU."""
    if config.torch_device.type != "cpu":
        return None
    return max(1, (len(os.sched_getaffinity(0)) - 1) // config.tensor_parallel_size)


def main() -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    start = read_start_message()
    config = start["config"]
    threads = cpu_threads(config)
    if threads is not None:
        torch.set_num_threads(threads)
    conn = Connection(start["fd"])
    EngineServer(start_engine(config), conn).serve()


if __name__ == "__main__":
    main()
