"""Every error the engine raises on purpose, in one place. Bad input raises ValueError naming the
field, the value and the limit; these are the others."""
from __future__ import annotations


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full (max_waiting); the caller should retry later or shed load."""


class EngineClosedError(RuntimeError):
    """The engine is shutting down, or gone, and accepts no new requests."""


class EngineDeadError(EngineClosedError):
    """The engine process exited while serving."""


class EngineStartError(RuntimeError):
    """The engine process failed to start; the message quotes its last output."""


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed or exited; the message quotes its last output."""


class RequestFailedError(RuntimeError):
    """A request ended with finish_reason "error" (its batch or its post-processing failed)."""

    def __init__(self, request_id: str, error: str) -> None:
        super().__init__(f"request {request_id!r} failed: {error}")
        self.request_id = request_id
        self.error = error


class RequestRefusedError(RequestFailedError, ValueError):
    """A request that failed mid-way for its own input (a constraint with no way on): INVALID_ARG, as a
    refusal at admission is (a ValueError), and in its words, without "request ... failed" (an engine fault's)."""

    def __init__(self, request_id: str, error: str) -> None:
        super().__init__(request_id, error)
        self.args = (error,)

    @staticmethod
    def of(request_id: str, error: str, is_input: bool) -> RequestFailedError:
        return (RequestRefusedError if is_input else RequestFailedError)(request_id, error)
