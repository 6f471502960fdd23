"""What the engine process (engine_process.py) and its front end (engine_client.py) say to each
other: pickled tuples over a multiprocessing.connection socket pair.

front end -> engine    (ADD, EngineRequest)           a validated request (processor.py)
                       (ABORT, request_id)
                       (SHUTDOWN, timeout_s or None)  finish, abort what is left at the deadline, exit
engine -> front end    (READY, EngineStats)           warmed up; serving from now on
                       (STEP, deltas, errors, EngineStats, adds_done)   after every pass of the loop
                       (CLOSED,)                      shut down; the process exits next

A STEP carries all the outputs of one engine step, each as a delta (DeltaEncoder), the requests that
failed outside the step ((request_id, exception)), the stats after the step (for the metrics), and
how many ADDs the engine has taken so far (with the stats' num_waiting, the front end's count of
waiting requests for max_waiting).
"""
from __future__ import annotations

import pickle

from llm_engine.outputs import RequestOutput, RequestStats
from llm_engine.processor import EngineRequest

ADD, ABORT, SHUTDOWN = "add", "abort", "shutdown"
READY, STEP, CLOSED = "ready", "step", "closed"


class DeltaEncoder:
    """Engine side: a RequestOutput as what is new in it, so a message stays small however long the
    streams grow (an output's text, token ids, logprobs and token times are cumulative)."""

    def __init__(self) -> None:
        self._times_sent: dict[str, int] = {}  # token times already sent, per unfinished request

    def encode(self, out: RequestOutput) -> tuple:
        stats, rid = out.stats, out.request_id
        sent = self._times_sent.pop(rid, 0) if out.finished else self._times_sent.get(rid, 0)
        if not out.finished:
            self._times_sent[rid] = len(stats.token_times)
        logprobs = None
        if out.logprobs is not None:
            logprobs = out.logprobs[len(out.logprobs) - len(out.delta_token_ids):]
        return (rid, out.delta_text, out.delta_token_ids, out.finish_reason, out.error, logprobs,
                stats.first_scheduled_time, stats.first_token_time, stats.finished_time,
                stats.token_times[sent:], stats.num_cached_tokens)

    def forget(self, request_id: str) -> None:
        self._times_sent.pop(request_id, None)


class OutputAssembler:
    """Front-end side: one request's RequestOutputs rebuilt from its deltas, as the engine made them."""

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] | None = None
        self.stats = RequestStats(arrival_time=request.arrival_time, num_prompt_tokens=len(request.prompt_token_ids))

    def apply(self, delta: tuple) -> RequestOutput:
        (rid, delta_text, delta_ids, finish_reason, error, logprobs,
         scheduled, first_token, finished, token_times, cached) = delta
        self.text += delta_text
        self.token_ids += delta_ids
        if logprobs is not None:
            self.logprobs = self.logprobs or []
            self.logprobs += logprobs
        stats = self.stats
        stats.first_scheduled_time, stats.first_token_time, stats.finished_time = scheduled, first_token, finished
        stats.token_times += token_times
        stats.num_cached_tokens = cached
        return RequestOutput(
            request_id=rid, prompt=self.request.prompt, prompt_token_ids=self.request.prompt_token_ids,
            text=self.text, delta_text=delta_text, token_ids=list(self.token_ids), delta_token_ids=delta_ids,
            finish_reason=finish_reason, logprobs=None if self.logprobs is None else list(self.logprobs),
            stats=stats, error=error)


def portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - e.g. an __init__ that takes other arguments than .args
        return RuntimeError(f"{type(exc).__name__}: {exc}")
