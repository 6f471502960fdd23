"""LLM metrics at the server's :8002 endpoint, labelled with model, version and the stub's pid.

Two sets: ours, `triton_llm_*`, and vllm_backend's `vllm:*` families with its names, meanings and
buckets (its README), plus the vLLM server's `vllm:num_requests_*` and `vllm:kv_cache_usage_perc`
gauges, so dashboards and alerts built for vllm_backend work unchanged. Gauges and token counters
are refreshed from the engine's stats by a timer thread. A request's own series (its time to first
token, its gaps between tokens, its end-to-end latency, sizes and counts) move a moment after the
fact, from a thread of their own: each observation is a round trip to Triton (25-45 us), and on the
thread that sends the responses a 400-token answer's 800 gap observations held the instance's other
streams for 20 ms (ITL p99 +10-15 ms at 8 streams an instance), the first token waited for its two,
and a finish's counters and sizes took 1.35 ms (their round trips waiting behind that thread's).
When its queue is full, a finish's counts are made on the loop and only its gaps left out.

Several instances of one model share one engine (response_instances.py): each publishes the
series of its own requests (histograms, finished-request counters), and one of them, the one the
engine names (`exporter`), the engine-wide ones (KV blocks, running and waiting requests,
preemptions, prefill and generated tokens), so a sum over the instances counts the engine once.
"""
from __future__ import annotations

import queue
import threading

import triton_python_backend_utils as pb_utils

_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_TOKEN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5]
# vllm_backend's (src/utils/metrics.py).
_VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_VLLM_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_VLLM_E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
_VLLM_N_BUCKETS = [1, 2, 5, 10, 20]
# Requests' latencies waiting to be observed; past this the newest are left out (and counted in the log):
# one thread's round trips, about 30k observations a second, fall behind only beyond ~15k tokens/s an instance.
_MAX_PENDING = 1024


def _buckets_1_2_5(maximum: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `maximum` (vLLM's build_1_2_5_buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > maximum:
                return out
            out.append(m * scale)
        scale *= 10


class LLMMetrics:
    def __init__(self, labels: dict[str, str], stats_fn, interval_s: float, max_model_len: int,
                 exporter=lambda: True):
        """`exporter()`: whether this instance publishes the engine-wide series now."""
        def family(name, description, kind):
            f = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self._families.append(f)  # a family that is garbage collected disappears from /metrics
            return f

        C, G, H = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        self._families: list = []
        self._labels = labels
        self.ttft = family("triton_llm_time_to_first_token_seconds",
                           "Time from arrival to the first output token", H).Metric(
                               labels=labels, buckets=_LATENCY_BUCKETS)
        self.first_response = family("triton_llm_time_to_first_response_seconds",
                                     "Time from arrival to the first response handed to Triton", H).Metric(
                                         labels=labels, buckets=_LATENCY_BUCKETS)
        self.tpot = family("triton_llm_time_per_output_token_seconds",
                           "Time between consecutive output tokens of a request", H).Metric(
                               labels=labels, buckets=_TOKEN_BUCKETS)
        self.e2e = family("triton_llm_e2e_request_latency_seconds",
                          "Time from arrival to the final response", H).Metric(
                              labels=labels, buckets=_LATENCY_BUCKETS)
        self.prompt_tokens = family("triton_llm_prompt_tokens_total",
                                    "Prompt tokens of finished requests", C).Metric(labels=labels)
        self.generation_tokens = family("triton_llm_generation_tokens_total",
                                        "Generated tokens of finished requests", C).Metric(labels=labels)
        self.requests = family("triton_llm_requests_finished_total",
                               "Finished requests", C).Metric(labels=labels)
        # Engine-wide: families now, their series while this instance is the exporter (_EngineSeries).
        self._engine_families = {
            "preemptions": family("triton_llm_preemptions_total",
                                  "Sequences preempted (KV dropped, recomputed later)", C),
            "kv_used": family("triton_llm_kv_cache_blocks_used", "KV-cache blocks in use", G),
            "kv_total": family("triton_llm_kv_cache_blocks_total", "KV-cache blocks in the pool", G),
            "running": family("triton_llm_num_requests_running", "Sequences in the running batch", G),
            "waiting": family("triton_llm_num_requests_waiting", "Sequences waiting to be scheduled", G),
            "vllm_prompt_tokens": family("vllm:prompt_tokens_total", "Number of prefill tokens processed.", C),
            "vllm_generation_tokens": family("vllm:generation_tokens_total",
                                             "Number of generation tokens processed.", C),
            "vllm_running": family("vllm:num_requests_running", "Number of requests in model execution batches.", G),
            "vllm_waiting": family("vllm:num_requests_waiting", "Number of requests waiting to be processed.", G),
            "vllm_kv_usage": family("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", G),
        }

        def vllm(name, description, kind, buckets=None):
            f = family(f"vllm:{name}", description, kind)
            return f.Metric(labels=labels, buckets=buckets) if buckets else f.Metric(labels=labels)

        self.vllm_ttft = vllm("time_to_first_token_seconds", "Histogram of time to first token in seconds.", H,
                              _VLLM_TTFT_BUCKETS)
        self.vllm_tpot = vllm("time_per_output_token_seconds", "Histogram of time per output token in seconds.",
                              H, _VLLM_TPOT_BUCKETS)
        self.vllm_e2e = vllm("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                             H, _VLLM_E2E_BUCKETS)
        self.vllm_request_prompt = vllm("request_prompt_tokens", "Number of prefill tokens processed.", H,
                                        _buckets_1_2_5(max_model_len))
        self.vllm_request_generation = vllm("request_generation_tokens", "Number of generation tokens processed.",
                                            H, _buckets_1_2_5(max_model_len))
        self.vllm_n = vllm("request_params_n", "Histogram of the n request parameter.", H, _VLLM_N_BUCKETS)
        self._stats_fn = stats_fn
        self._exporter = exporter
        self.engine: _EngineSeries | None = None
        self._update_engine_series(stats_fn())  # the warm-up's tokens are not traffic: counted from here
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, args=(interval_s,), daemon=True,
                                        name="triton_llm-metrics")
        self._thread.start()
        # Lists of ((metric methods), [values]): each value to each method; None: stop
        self._pending: queue.Queue = queue.Queue(_MAX_PENDING)
        self._left_out = 0
        self._observer = threading.Thread(target=self._observe_pending, daemon=True, name="triton_llm-latencies")
        self._observer.start()

    def observe_first_token(self, ttft_s: float) -> None:
        self._later([((self.ttft.observe, self.vllm_ttft.observe), [ttft_s])])

    def observe_first_response(self, seconds: float) -> None:
        self._later([((self.first_response.observe,), [seconds])])

    def observe_finished(self, stats) -> None:
        """`stats` is the request's llm_engine RequestStats."""
        counts = [((self.prompt_tokens.increment, self.vllm_request_prompt.observe), [stats.num_prompt_tokens]),
                  ((self.generation_tokens.increment, self.vllm_request_generation.observe),
                   [stats.num_generated_tokens]),
                  ((self.requests.increment, self.vllm_n.observe), [1])]
        if stats.finished_time is not None:
            counts.append(((self.e2e.observe, self.vllm_e2e.observe), [stats.finished_time - stats.arrival_time]))
        gaps = stats.inter_token_latencies
        if not self._later(counts + ([((self.tpot.observe, self.vllm_tpot.observe), gaps)] if gaps else [])):
            _apply(counts)   # the queue is full: the gaps are left out, the counts kept

    def refresh(self) -> None:
        stats = self._stats_fn()
        if self.engine is not None:
            self.engine.update(stats)
        self._update_engine_series(stats)

    def _update_engine_series(self, stats) -> None:
        """The engine-wide series appear when this instance becomes the exporter (counting from
        `stats`), and go (deleted) when it no longer is."""
        exporting = self._exporter()
        if exporting and self.engine is None:
            self.engine = _EngineSeries(self._engine_families, self._labels, stats)
        elif not exporting and self.engine is not None:
            self.engine = None

    def _later(self, groups: list) -> bool:
        """`groups` ((metric methods), [values]) for the observing thread; False if its queue is full."""
        try:
            self._pending.put_nowait(groups)
            return True
        except queue.Full:
            self._left_out += 1
            if self._left_out in (1, 10, 100) or self._left_out % 1000 == 0:
                pb_utils.Logger.log_warn(f"triton_llm: the latency histograms are behind; {self._left_out} "
                                         "requests' latencies left out so far")
            return False

    def _observe_pending(self) -> None:
        while (groups := self._pending.get()) is not None:
            try:
                _apply(groups)
            except Exception as exc:  # noqa: BLE001 - stats must never take the model down
                pb_utils.Logger.log_warn(f"triton_llm: observing latencies failed: {exc}")

    def _refresh_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.refresh()
            except Exception as exc:  # stats must never take the model down
                pb_utils.Logger.log_warn(f"triton_llm: metrics refresh failed: {exc}")

    def close(self) -> None:
        """What is pending is observed first (the histograms' families outlive this)."""
        self._stop.set()
        try:
            self._pending.put(None, timeout=5)   # after what is queued
        except queue.Full:
            pass
        self._thread.join(timeout=5)
        self._observer.join(timeout=5)
        if self._observer.is_alive():
            pb_utils.Logger.log_warn("triton_llm: the latency histograms were still being written at unload")


def _apply(groups: list) -> None:
    for methods, values in groups:
        for value in values:
            for method in methods:
                method(value)


class _EngineSeries:
    """The engine-wide series of the exporting instance; deleted with this object."""

    def __init__(self, families: dict, labels: dict[str, str], start) -> None:
        for name, f in families.items():
            setattr(self, name, f.Metric(labels=labels))
        self._preemptions_seen = start.num_preemptions
        self._tokens_seen = (start.num_prompt_tokens, start.num_generation_tokens)  # already counted
        self.update(start)

    def update(self, stats) -> None:
        self.kv_used.set(stats.kv_blocks_used)
        self.kv_total.set(stats.kv_blocks_total)
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.vllm_running.set(stats.num_running)
        self.vllm_waiting.set(stats.num_waiting)
        self.vllm_kv_usage.set(stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0)
        self._preemptions_seen = _count_on(self.preemptions, stats.num_preemptions, self._preemptions_seen)
        prompt_seen, generation_seen = self._tokens_seen
        self._tokens_seen = (_count_on(self.vllm_prompt_tokens, stats.num_prompt_tokens, prompt_seen),
                             _count_on(self.vllm_generation_tokens, stats.num_generation_tokens, generation_seen))


def _count_on(counter, total: int, seen: int) -> int:
    """Adds what an engine counter grew by since `seen` (a restarted engine counts from 0); the new seen."""
    if total < seen:
        seen = 0
    if total > seen:
        counter.increment(total - seen)
    return total
