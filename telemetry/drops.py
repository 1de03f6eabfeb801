"""What telemetry itself could not deliver, counted in one place.

A sink that drops data (a full queue, an unreachable or rejecting backend) adds to these counts;
the OpenTelemetry sink exports them as counters (catalogue rows with `observed=True`), so a
backend that loses data shows it on the same `/metrics` that pages on training health. The
counts are process-wide: one process trains one run at a time, and the backends' clients are
per process too.
"""

from __future__ import annotations

import threading


class Drops:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def add(self, metric: str, n: float = 1, **attrs: str) -> None:
        if n <= 0:
            return
        key = (metric, tuple(sorted(attrs.items())))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + n

    def observe(self, metric: str, initial: tuple[dict[str, str], ...] = ()) -> list[tuple[float, dict[str, str]]]:
        """(value, attributes) of every series of `metric`; `initial` series are reported at 0 until
        they count something (so `increase()` sees the first drop)."""
        with self._lock:
            counts = {attrs: v for (m, attrs), v in self._counts.items() if m == metric}
        for attrs in initial:
            counts.setdefault(tuple(sorted(attrs.items())), 0.0)
        return [(v, dict(attrs)) for attrs, v in counts.items()]

    def report(self) -> dict[str, float]:
        """Every non-zero count, keyed like 'grpo.traces.dropped{reason=unreachable,signal=spans}' (for summaries)."""
        with self._lock:
            return {f"{m}{{{','.join(f'{k}={v}' for k, v in attrs)}}}": n for (m, attrs), n in sorted(self._counts.items())}

    def total(self, metric: str) -> float:
        with self._lock:
            return sum(v for (m, _), v in self._counts.items() if m == metric)


DROPS = Drops()
