"""LLM metrics at the server's :8002 endpoint, labelled with model and version.

Names carry a `triton_llm_` prefix: they are measured by this backend, so they are not vLLM's
metrics even where the idea is close. Gauges are refreshed from engine stats by a timer thread;
counters and histograms move when a request produces its first token or finishes.
"""
from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_TOKEN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5]


class LLMMetrics:
    def __init__(self, labels: dict[str, str], stats_fn, interval_s: float = 1.0):
        def family(name, description, kind):
            f = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self._families.append(f)  # a family that is garbage collected disappears from /metrics
            return f

        C, G, H = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        self._families: list = []
        self.ttft = family("triton_llm_time_to_first_token_seconds",
                           "Time from arrival to the first output token", H).Metric(
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
        self.preemptions = family("triton_llm_preemptions_total",
                                  "Sequences preempted (KV dropped, recomputed later)", C).Metric(labels=labels)
        self.kv_used = family("triton_llm_kv_cache_blocks_used", "KV-cache blocks in use", G).Metric(labels=labels)
        self.kv_total = family("triton_llm_kv_cache_blocks_total", "KV-cache blocks in the pool",
                               G).Metric(labels=labels)
        self.running = family("triton_llm_num_requests_running", "Sequences in the running batch",
                              G).Metric(labels=labels)
        self.waiting = family("triton_llm_num_requests_waiting", "Sequences waiting to be scheduled",
                              G).Metric(labels=labels)
        self._stats_fn = stats_fn
        self._preemptions_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, args=(interval_s,), daemon=True,
                                        name="triton_llm-metrics")
        self._thread.start()

    def observe_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def observe_finished(self, stats) -> None:
        """`stats` is the request's llm_engine RequestStats."""
        if stats.finished_time is not None:
            self.e2e.observe(stats.finished_time - stats.arrival_time)
        for gap in stats.inter_token_latencies:
            self.tpot.observe(gap)
        self.prompt_tokens.increment(stats.num_prompt_tokens)
        self.generation_tokens.increment(stats.num_generated_tokens)
        self.requests.increment(1)

    def refresh(self) -> None:
        stats = self._stats_fn()
        self.kv_used.set(stats.kv_blocks_used)
        self.kv_total.set(stats.kv_blocks_total)
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        if stats.num_preemptions < self._preemptions_seen:  # a restarted engine counts from 0
            self._preemptions_seen = 0
        if stats.num_preemptions > self._preemptions_seen:
            self.preemptions.increment(stats.num_preemptions - self._preemptions_seen)
            self._preemptions_seen = stats.num_preemptions

    def _refresh_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.refresh()
            except Exception as exc:  # stats must never take the model down
                pb_utils.Logger.log_warn(f"triton_llm: metrics refresh failed: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
