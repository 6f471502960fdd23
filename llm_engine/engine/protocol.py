"""What the engine process (engine_process.py) and its client (process_client.py) say to each other:
pickled tuples over a multiprocessing.connection socket pair.

client -> engine    (ADD, EngineRequest)           a validated, admitted request (input_processor.py)
                    (ABORT, request_id)
                    (SHUTDOWN, timeout_s or None)  finish, abort what is left at the deadline, exit
engine -> client    (READY, EngineStats)           warmed up; serving from now on
                    (STEP, StepReport)             after every pass of the loop (engine_loop.py)
                    (CLOSED,)                      shut down; the process exits next

A StepReport carries the same RequestDeltas the engine produced, so a message stays small however
long the streams grow.
"""
from __future__ import annotations

import pickle

ADD, ABORT, SHUTDOWN = "add", "abort", "shutdown"
READY, STEP, CLOSED = "ready", "step", "closed"


def portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - e.g. an __init__ that takes other arguments than .args
        return RuntimeError(f"{type(exc).__name__}: {exc}")
