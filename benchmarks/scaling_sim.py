"""Replays a load curve against deploy/k8s's HorizontalPodAutoscaler rule with the measured per-replica capacity,
and prints the replicas and the queue wait over time (docs/scaling.md).

Capacity: one replica (one GPU) serves `concurrency` streams within the TTFT objective, completing `rps` requests
a second there (measured output tokens/s at that concurrency over the mix's mean output length); each request holds
its slot concurrency / rps seconds (Little's law). Past `concurrency`, requests wait in the llm's queue (the
`waiting` metric), and a request's TTFT is the measured TTFT at the running concurrency plus its time in that queue.

The autoscaler is the HPA's algorithm on the rule's metrics and targets (deploy/k8s/components/autoscaling/hpa.yaml,
read from the file): every `sync` seconds, for each metric, desired = ceil(sum over ready pods / target) when the
average is off its target by more than the tolerance (10%); the largest wins; up at most by the scale-up policies
in their period, down only to the largest recommendation of the stabilization window and by the scale-down policy.
The metrics the HPA sees are `metrics_lag_s` old (scrape interval, rate window, adapter cache). A new pod serves
`startup_s` after it is asked for (a GPU node, the image, loading and warming the model). A fluid model: no request
is refused, the load is spread evenly over ready pods, the non-LLM steps and Triton's queue are not modelled.

    python -m benchmarks.scaling_sim                          # the built-in day: ramp, peak, burst, night
    python -m benchmarks.scaling_sim --ttft-slo-ms 500 --output-tokens 200 --curve 0:5,600:40,1800:40,2400:5
"""
from __future__ import annotations

import argparse
import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
HPA_FILE = ROOT / "deploy" / "k8s" / "components" / "autoscaling" / "hpa.yaml"

# Measured: one NVIDIA H200, a Llama-3-8B-shaped model in bf16, through Triton (gRPC streams), prompts of 128 to 1,024
# tokens and outputs of 128 to 512 (mean 320), issue 24's table (commit 0008057, benchmarks/bench_serving.py):
# concurrency -> (output tok/s, TTFT p50 s, TTFT p99 s).
H200_8B = {1: (218.0, 0.0308, 0.0320), 16: (2398.0, 0.0450, 0.225), 64: (5747.0, 0.123, 0.968),
           256: (8579.0, 1.641, 4.052)}
H200_8B_MEAN_OUTPUT = 320


@dataclass(frozen=True)
class Capacity:
    concurrency: float    # streams a replica runs within the TTFT objective (the llm's max_num_seqs)
    rps: float            # requests a second it completes there
    ttft_s: float         # the TTFT percentile at that concurrency

    @property
    def hold_s(self) -> float:
        """How long a request holds its slot (Little's law)."""
        return self.concurrency / self.rps


def _interpolate(table: dict[int, tuple], concurrency: float, column: int) -> float:
    """Log-linear in concurrency between the measured points; clamped at the ends."""
    points = sorted(table)
    if concurrency <= points[0]:
        return table[points[0]][column]
    if concurrency >= points[-1]:
        return table[points[-1]][column]
    i = bisect.bisect_right(points, concurrency)
    lo, hi = points[i - 1], points[i]
    w = (math.log(concurrency) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return table[lo][column] + w * (table[hi][column] - table[lo][column])


def capacity_at_slo(ttft_slo_s: float, output_tokens: float = H200_8B_MEAN_OUTPUT, table=H200_8B,
                    percentile: str = "p99") -> Capacity:
    """The largest concurrency whose TTFT percentile meets the objective (to a whole stream), and what it serves."""
    column = {"p50": 1, "p99": 2}[percentile]
    if _interpolate(table, 1, column) > ttft_slo_s:
        raise ValueError(f"no concurrency meets a TTFT {percentile} of {ttft_slo_s * 1e3:.0f} ms on this table")
    lo, hi = 1, max(table)
    while lo < hi:                      # TTFT rises with concurrency
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _interpolate(table, mid, column) <= ttft_slo_s else (lo, mid - 1)
    return Capacity(lo, _interpolate(table, lo, 0) / output_tokens, _interpolate(table, lo, column))


def replicas_for(rate_rps: float, capacity: Capacity, utilization: float = 0.75) -> int:
    """Replicas that serve `rate_rps` with each at `utilization` of its capacity at the objective."""
    return max(1, math.ceil(rate_rps / (capacity.rps * utilization)))


@dataclass
class Rule:
    """The HPA's settings: targets per pod by metric, bounds, behaviour."""
    targets: dict[str, float]
    min_replicas: int
    max_replicas: int
    up_policies: list[tuple[str, int, int]]      # (Pods | Percent, value, period s)
    up_window_s: int
    down_policies: list[tuple[str, int, int]]
    down_window_s: int
    tolerance: float = 0.1
    sync_s: int = 15

    @classmethod
    def from_hpa(cls, path: Path = HPA_FILE) -> "Rule":
        spec = yaml.safe_load(path.read_text())["spec"]
        targets = {m["pods"]["metric"]["name"]: _quantity(m["pods"]["target"]["averageValue"]) for m in spec["metrics"]}
        behavior = spec["behavior"]

        def policies(direction):
            return [(p["type"], p["value"], p["periodSeconds"]) for p in behavior[direction]["policies"]]
        return cls(targets, spec["minReplicas"], spec["maxReplicas"], policies("scaleUp"),
                   behavior["scaleUp"]["stabilizationWindowSeconds"], policies("scaleDown"),
                   behavior["scaleDown"]["stabilizationWindowSeconds"])


def _quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as the HPA's averageValue takes it: 48, 800m, 1.5."""
    text = str(text)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@dataclass
class Sample:
    t: int
    load_rps: float
    replicas: int          # asked for (the Deployment's count)
    ready: int
    running: float         # per ready pod
    waiting: float         # per ready pod
    queue_wait_s: float    # what a request arriving now waits for a slot
    ttft_s: float          # the measured TTFT at the running concurrency plus that wait


@dataclass
class Simulation:
    capacity: Capacity
    rule: Rule
    startup_s: int = 180
    metrics_lag_s: int = 30
    # Streams of the mix whose KV fills a replica's pool: 128 KiB a token (8B Llama, bf16), ~900 tokens a stream,
    # ~110 GB of pool on an H200.
    kv_streams: float = 900.0
    table: dict = field(default_factory=lambda: H200_8B)

    def run(self, curve: list[tuple[float, float]], duration_s: int | None = None) -> list[Sample]:
        """`curve`: (time s, requests/s) points, linear between them."""
        duration_s = duration_s or int(curve[-1][0])
        cap, rule = self.capacity, self.rule
        replicas = rule.min_replicas
        starts: list[int] = []                        # when pods asked for by scale-ups become ready
        ready = replicas
        running = waiting = 0.0                       # totals
        seen: deque[tuple[int, dict[str, float], int]] = deque()   # (t, metric totals, ready) for the lag
        recommendations: deque[tuple[int, int]] = deque()           # (t, desired) for the windows
        changes: deque[tuple[int, int]] = deque()                   # (t, +/- pods) for the policies
        out = []
        for t in range(duration_s + 1):
            ready += sum(1 for s in starts if s == t)
            starts = [s for s in starts if s > t]
            ready = min(ready, replicas)
            rate = _load(curve, t)
            # One second of the fluid model: arrivals queue, free slots admit, each running request ends after hold_s.
            waiting += rate
            finished = running / cap.hold_s
            running -= finished
            admitted = min(waiting, max(0.0, ready * cap.concurrency - running))
            running += admitted
            waiting -= admitted
            per_pod_running = running / ready if ready else 0.0
            queue_wait = waiting / (ready * cap.rps) if ready else float("inf")
            ttft = _interpolate(self.table, max(1.0, per_pod_running), 2) + queue_wait
            totals = {"ragstack_llm_requests_running": running, "ragstack_llm_requests_waiting": waiting,
                      "ragstack_llm_kv_cache_usage": running / self.kv_streams,
                      "ragstack_triton_queue_seconds": 0.0}
            seen.append((t, totals, ready))
            out.append(Sample(t, rate, replicas, ready, per_pod_running, waiting / ready if ready else waiting,
                              queue_wait, ttft))
            if t % rule.sync_s or t < self.metrics_lag_s:
                continue
            while seen and seen[0][0] < t - self.metrics_lag_s:
                seen.popleft()
            _, lagged, lagged_ready = seen[0]
            desired = self._desired(replicas, lagged, lagged_ready)
            replicas_before = replicas
            replicas = self._apply(t, replicas, desired, recommendations, changes)
            if replicas > replicas_before:
                starts += [t + self.startup_s] * (replicas - replicas_before)
            elif replicas < replicas_before:          # the newest go first: pending ones, then ready ones
                pending_removed = min(len(starts), replicas_before - replicas)
                starts = sorted(starts)[:len(starts) - pending_removed]
                ready = min(ready, replicas)
        return out

    def _desired(self, replicas: int, totals: dict[str, float], ready: int) -> int:
        desired = []
        for name, target in self.rule.targets.items():
            if name not in totals or ready == 0:
                continue
            average = totals[name] / ready
            if abs(average / target - 1) <= self.rule.tolerance:
                desired.append(replicas)
            else:
                desired.append(math.ceil(totals[name] / target))
        return max(desired) if desired else replicas

    def _apply(self, t: int, replicas: int, desired: int, recommendations: deque, changes: deque) -> int:
        rule = self.rule
        desired = min(rule.max_replicas, max(rule.min_replicas, desired))
        recommendations.append((t, desired))
        window = max(rule.up_window_s, rule.down_window_s)
        while recommendations and recommendations[0][0] < t - window:
            recommendations.popleft()
        if desired > replicas:
            up = [d for s, d in recommendations if s >= t - rule.up_window_s]
            target = min(up) if up else desired
            allowed = max(self._allowance(t, replicas, rule.up_policies, changes, +1))
            new = min(max(target, replicas), replicas + allowed)
        else:
            down = [d for s, d in recommendations if s >= t - rule.down_window_s]
            target = max(down) if down else desired
            allowed = min(self._allowance(t, replicas, rule.down_policies, changes, -1))
            new = max(min(target, replicas), replicas - allowed)
        if new != replicas:
            changes.append((t, new - replicas))
        return new

    @staticmethod
    def _allowance(t: int, replicas: int, policies, changes: deque, sign: int) -> list[int]:
        """Pods each policy still lets the count move in `sign`'s direction now."""
        out = []
        for kind, value, period in policies:
            moved = sum(d for s, d in changes if s > t - period and d * sign > 0) * sign
            base = replicas - moved * sign
            limit = value if kind == "Pods" else math.ceil(base * value / 100)
            out.append(max(0, limit - moved))
        return out


def _load(curve: list[tuple[float, float]], t: float) -> float:
    times = [p[0] for p in curve]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return curve[0][1]
    if i == len(curve):
        return curve[-1][1]
    (t0, r0), (t1, r1) = curve[i - 1], curve[i]
    return r0 + (r1 - r0) * (t - t0) / (t1 - t0)


# A day compressed to 2 hours: quiet, a morning ramp to a peak of 4x, a burst to 6x for 5 minutes, back down.
DAY = [(0, 10), (1200, 10), (2400, 40), (3600, 40), (3700, 60), (4000, 60), (4100, 40), (5400, 40), (6600, 10),
       (7200, 10)]


def parse_curve(text: str) -> list[tuple[float, float]]:
    points = [tuple(float(x) for x in pair.split(":")) for pair in text.split(",")]
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise argparse.ArgumentTypeError("curve times must increase")
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="TTFT objective (default 1000 ms, at p99)")
    parser.add_argument("--percentile", choices=["p50", "p99"], default="p99")
    parser.add_argument("--output-tokens", type=float, default=H200_8B_MEAN_OUTPUT,
                        help=f"mean output tokens of the mix (default {H200_8B_MEAN_OUTPUT}, the measured mix's)")
    parser.add_argument("--curve", type=parse_curve, default=DAY, help="T:RPS,T:RPS,... (default: a compressed day)")
    parser.add_argument("--startup-s", type=int, default=180, help="from scale-up to a ready pod (default 180)")
    parser.add_argument("--metrics-lag-s", type=int, default=30, help="age of the metrics the HPA sees (default 30)")
    parser.add_argument("--hpa", type=Path, default=HPA_FILE, help="the HorizontalPodAutoscaler to replay")
    parser.add_argument("--every", type=int, default=300, help="print a line every N seconds (default 300)")
    args = parser.parse_args(argv)

    capacity = capacity_at_slo(args.ttft_slo_ms / 1e3, args.output_tokens, percentile=args.percentile)
    rule = Rule.from_hpa(args.hpa)
    print(f"capacity per replica at TTFT {args.percentile} <= {args.ttft_slo_ms:.0f} ms: {capacity.concurrency:.0f} "
          f"streams (max_num_seqs), {capacity.rps:.1f} req/s, TTFT {capacity.ttft_s * 1e3:.0f} ms; a request holds "
          f"its slot {capacity.hold_s:.1f} s")
    print(f"suggested targets: running {0.75 * capacity.concurrency:.0f} per pod (3/4 of the streams), "
          f"waiting 4 per pod (about {4 / capacity.rps * 1e3:.0f} ms in the queue)")
    peak = max(r for _, r in args.curve)
    print(f"replicas for the peak {peak:g} req/s at 75% of capacity: {replicas_for(peak, capacity)}")
    print(f"HPA ({args.hpa.relative_to(ROOT) if args.hpa.is_relative_to(ROOT) else args.hpa}): "
          + ", ".join(f"{k} {v:g}" for k, v in rule.targets.items())
          + f"; {rule.min_replicas}..{rule.max_replicas} replicas")
    samples = Simulation(capacity, rule, args.startup_s, args.metrics_lag_s).run(args.curve)
    print(f"{'t s':>6} {'req/s':>6} {'replicas':>8} {'ready':>5} {'running/pod':>11} {'waiting/pod':>11} "
          f"{'queue wait s':>12} {'TTFT s':>7}")
    for s in samples:
        if s.t % args.every == 0:
            print(f"{s.t:>6} {s.load_rps:>6.1f} {s.replicas:>8} {s.ready:>5} {s.running:>11.1f} {s.waiting:>11.1f} "
                  f"{s.queue_wait_s:>12.2f} {s.ttft_s:>7.2f}")
    over = [s for s in samples if s.ttft_s > args.ttft_slo_ms / 1e3]
    print(f"over the objective {len(over)} of {len(samples)} s; worst queue wait "
          f"{max(s.queue_wait_s for s in samples):.1f} s; most replicas {max(s.replicas for s in samples)}; "
          f"replica-hours {sum(s.replicas for s in samples) / 3600:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
