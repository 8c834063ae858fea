"""What `tirl sandbox serve` counts and how `GET /metrics` shows it: runs by status, a run latency histogram,
requests refused before running, the pool's queue and workers, and per tier (light/heavy) idle and busy workers,
recycled workers and runs routed there, in the Prometheus text format.

The counters are updated on the server's event loop only (no lock); the pool's own figures are read when the
page is rendered (`LocalSandbox.stats`). Not here: deciding anything from them.
"""

from __future__ import annotations

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STATUSES = ("ok", "runtime_error", "timeout", "memory_exceeded", "output_truncated", "sandbox_error")
TIERS = ("light", "heavy")
# (name, Prometheus type, the pool's stats key after "<tier>_", help) of each per-tier series
_TIER_SERIES = (
    ("tier_idle_workers", "gauge", "idle", "Started workers of the tier waiting for a run."),
    ("tier_busy_workers", "gauge", "busy", "Started workers of the tier running a snippet."),
    ("tier_recycles_total", "counter", "recycles", "Workers of the tier replaced (kill, crash, max runs)."),
    ("tier_routed_total", "counter", "runs", "Runs the router sent to the tier."),
)


class Metrics:
    """Counters and a latency histogram, rendered in the Prometheus text format (updated on the event loop)."""

    def __init__(self) -> None:
        self.runs = dict.fromkeys(STATUSES, 0)
        self.buckets = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.rejected = {"overloaded": 0, "too_large": 0, "bad_request": 0, "unauthorized": 0}

    def observe(self, status: str, seconds: float) -> None:
        self.runs[status] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i, le in enumerate(LATENCY_BUCKETS):
            if seconds <= le:
                self.buckets[i] += 1

    def render(self, stats: dict[str, int], inflight: int) -> str:
        runs = [(f'{{status="{s}"}}', n) for s, n in self.runs.items()]
        hist = [(f'_bucket{{le="{le}"}}', n) for le, n in zip(LATENCY_BUCKETS, self.buckets, strict=True)]
        hist += [('_bucket{le="+Inf"}', self.latency_count), ("_sum", self.latency_sum)]
        hist += [("_count", self.latency_count)]
        rejected = [(f'{{reason="{r}"}}', n) for r, n in self.rejected.items()]
        lines = _block("tirl_sandbox_runs_total", "counter", "Runs finished, by result status.", runs)
        lines += _block(
            "tirl_sandbox_run_seconds", "histogram", "Run latency at the server, queueing included.", hist
        )
        lines += _block(
            "tirl_sandbox_rejected_total", "counter", "Requests refused before running.", rejected
        )
        for name, value, help_ in (
            ("queue_depth", stats["waiting"], "Runs waiting for a free worker."),
            ("inflight", inflight, "Requests being run or waiting."),
            ("workers", stats["workers"], "Warm workers in the pool."),
            ("idle_workers", stats["idle"], "Workers ready for a run."),
        ):
            lines += _block(f"tirl_sandbox_{name}", "gauge", help_, [("", value)])
        for name, kind, key, help_ in _TIER_SERIES:
            samples = [(f'{{tier="{t}"}}', stats[f"{t}_{key}"]) for t in TIERS]
            lines += _block(f"tirl_sandbox_{name}", kind, help_, samples)
        return "\n".join(lines) + "\n"


def _block(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> list[str]:
    """One metric: its HELP and TYPE lines, then a line per sample (label set or suffix, value)."""
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"] + [f"{name}{k} {v}" for k, v in samples]
