"""Read-side helpers over the long-format samples: one series per (source, metric), cached,
with window means and nearest-value look-ups by binary search.

The sampler writes every few hundred milliseconds, so a plain mean of the samples inside a
window is a fair time-average; nothing here interpolates.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from stepscope.store.db import RunReader


@dataclass(frozen=True)
class Series:
    """Times (sorted) and values of one metric from one source."""

    t: list[float]
    v: list[float]

    def window(self, t0: float | None, t1: float | None) -> list[float]:
        """Values with ``t0 <= t <= t1`` (open ends when None)."""
        lo = 0 if t0 is None else bisect.bisect_left(self.t, t0)
        hi = len(self.t) if t1 is None else bisect.bisect_right(self.t, t1)
        return self.v[lo:hi]

    def mean(self, t0: float | None = None, t1: float | None = None) -> float | None:
        vals = self.window(t0, t1)
        return sum(vals) / len(vals) if vals else None

    def max(self, t0: float | None = None, t1: float | None = None) -> float | None:
        vals = self.window(t0, t1)
        return max(vals) if vals else None

    def min(self, t0: float | None = None, t1: float | None = None) -> float | None:
        vals = self.window(t0, t1)
        return min(vals) if vals else None

    def nearest(self, t: float, max_gap_s: float | None = None) -> float | None:
        """The value sampled closest to ``t`` (None if the series is empty or too far)."""
        if not self.t:
            return None
        i = bisect.bisect_left(self.t, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(self.t)), key=lambda j: abs(self.t[j] - t))
        if max_gap_s is not None and abs(self.t[best] - t) > max_gap_s:
            return None
        return self.v[best]

    def argmax(self) -> tuple[float, float] | None:
        """(time, value) of the largest value."""
        if not self.v:
            return None
        i = max(range(len(self.v)), key=self.v.__getitem__)
        return self.t[i], self.v[i]

    def __bool__(self) -> bool:
        return bool(self.t)


class SampleCache:
    """Loads each (source, metric) series once from a RunReader.

    Examples:
        >>> cache = SampleCache(reader)
        >>> cache.get("host", "cpu_util_pct").mean(t0, t1)
    """

    def __init__(self, reader: RunReader) -> None:
        self._reader = reader
        self._series: dict[tuple[str, str], Series] = {}
        self._sources: dict[str, list[str]] = {}

    def get(self, source: str, metric: str) -> Series:
        key = (source, metric)
        if key not in self._series:
            t, v = self._reader.series(metric, source=source)
            self._series[key] = Series(t, v)
        return self._series[key]

    def sources(self, metric: str) -> list[str]:
        """Every source that recorded ``metric``."""
        if metric not in self._sources:
            self._sources[metric] = self._reader.sources(metric)
        return self._sources[metric]

    def mean(self, source: str, metric: str, t0: float | None, t1: float | None) -> float | None:
        return self.get(source, metric).mean(t0, t1)
