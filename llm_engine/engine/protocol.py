"""What the engine process (engine_process.py) and its clients (process_client.py) say to each other:
pickled tuples over multiprocessing.connection connections, one per client: the socket pair the
starting client made, or a connection to the engine's Unix socket (a shared engine, engine_share.py).

client -> engine    (HELLO,)                       a client that connected to the socket asks to join
                    (ADD, EngineRequest)           a validated, admitted request (input_processor.py)
                    (ABORT, request_id)
                    (DETACH, timeout_s or None)    this client leaves: its requests finish, those left at
                                                   the deadline are aborted, then CLOSED
                    (NOTE, note)                   for the engine's other clients, passed on as it is (a
                                                   model instance that got an abort for a request another
                                                   instance holds: llm_engine knows nothing of its meaning)
engine -> client    (READY, EngineStats, pid)      warmed up (the starter), or joined (HELLO's answer)
                    (REFUSED, reason)              HELLO's answer from an engine that takes no more clients
                    (STEP, StepReport, exporter)   after every pass of the loop: this client's deltas and
                                                   errors, the engine's stats and this client's count of
                                                   requests taken; `exporter`: this client is the engine's
                                                   oldest, the one that publishes its engine-wide metrics
                    (CLOSED, clients_left)         this client's requests are over; with 0 clients left the
                                                   engine closes and its process exits
                    (NOTE, note)                   another client's NOTE

A StepReport carries the same RequestDeltas the engine produced, so a message stays small however
long the streams grow. Request ids are the clients' own; an id already in use fails that request.
"""
from __future__ import annotations

import pickle

HELLO, ADD, ABORT, DETACH, NOTE = "hello", "add", "abort", "detach", "note"
READY, REFUSED, STEP, CLOSED = "ready", "refused", "step", "closed"


def portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - e.g. an __init__ that takes other arguments than .args
        return RuntimeError(f"{type(exc).__name__}: {exc}")
