"""The server's metrics in Prometheus' text exposition format (``GET /metrics``).

Counters of requests by endpoint and status, gauges of queued requests and active sessions,
and histograms of the time to first token and of each generation's tokens per second. The
figures are kept under one lock (the loop and the session threads both record).
"""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["Histogram", "Metrics"]

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RATE_BUCKETS = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms are."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = [
            f'{name}_bucket{{le="{b:g}"}} {c}'
            for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """What ``/metrics`` reports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.queue_depth = 0
        self.active_sessions = 0
        self.generated_tokens = 0
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.rate = Histogram(_RATE_BUCKETS)

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def set_queue(self, depth: int) -> None:
        with self._lock:
            self.queue_depth = depth

    def set_active(self, active: int) -> None:
        with self._lock:
            self.active_sessions = active

    def generation(self, ttft_s: float | None, tokens: int, tokens_per_second: float) -> None:
        """A generation of ``tokens`` ended: its time to first token (None: it made none)
        and decode rate (0: none, fewer than two tokens)."""
        with self._lock:
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            if tokens_per_second > 0:
                self.rate.observe(tokens_per_second)
            self.generated_tokens += tokens

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP ptexec_requests_total Requests answered, by endpoint and status.",
                "# TYPE ptexec_requests_total counter",
            ]
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(
                    f'ptexec_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}'
                )
            lines += [
                "# HELP ptexec_queue_depth Requests waiting for a session.",
                "# TYPE ptexec_queue_depth gauge",
                f"ptexec_queue_depth {self.queue_depth}",
                "# HELP ptexec_active_sessions Sessions generating now.",
                "# TYPE ptexec_active_sessions gauge",
                f"ptexec_active_sessions {self.active_sessions}",
                "# HELP ptexec_generated_tokens_total Tokens generated.",
                "# TYPE ptexec_generated_tokens_total counter",
                f"ptexec_generated_tokens_total {self.generated_tokens}",
                "# HELP ptexec_time_to_first_token_seconds From arrival to the first token sampled.",
                "# TYPE ptexec_time_to_first_token_seconds histogram",
                *self.ttft.lines("ptexec_time_to_first_token_seconds"),
                "# HELP ptexec_tokens_per_second Decode rate of each generation of two tokens or more "
                "(the tokens after the first per second).",
                "# TYPE ptexec_tokens_per_second histogram",
                *self.rate.lines("ptexec_tokens_per_second"),
            ]
        return "\n".join(lines) + "\n"
