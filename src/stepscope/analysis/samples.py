"""Read-side helpers over the long-format samples: one series per (source, metric), cached,
with window means and nearest-value look-ups by binary search.

The sampler writes every few hundred milliseconds, so a plain mean of the samples inside a
window is a fair time-average; nothing here interpolates.

A long run keeps its older samples only as per-slice roll-ups (mean, lowest, highest: see
:mod:`stepscope.store.rollups`). A series is read as one of those figures (``stat``); a peak
must read ``max``, or a spike inside a rolled-up minute reads as that minute's mean.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from stepscope.store.db import RunReader
from stepscope.store.queries import Stat


@dataclass(frozen=True)
class Series:
    """Times (sorted) and values of one metric from one source. Where ``n`` is given, ``n[i]``
    samples stand behind point i (more than one: a roll-up of the slice ``slice_lo[i]`` <= t <
    ``slice_hi[i]``); without it every point is a raw sample."""

    t: list[float]
    v: list[float]
    n: list[int] = field(default_factory=list)
    slice_lo: list[float] = field(default_factory=list)
    slice_hi: list[float] = field(default_factory=list)

    def rolled(self, i: int) -> bool:
        """Whether point i is a roll-up of several samples, not one raw sample."""
        return bool(self.n) and self.n[i] > 1

    @property
    def any_rolled(self) -> bool:
        return any(k > 1 for k in self.n)

    def slice_at(self, i: int) -> tuple[float, float]:
        """The stretch of time point i stands for (a raw sample's is its own instant)."""
        return (self.slice_lo[i], self.slice_hi[i]) if self.rolled(i) else (self.t[i], self.t[i])

    def argmax_in(self, lo: float, hi: float) -> int | None:
        """The index of the highest value among the points with lo <= t < hi."""
        a, b = bisect.bisect_left(self.t, lo), bisect.bisect_left(self.t, hi)
        return max(range(a, b), key=self.v.__getitem__) if a < b else None

    def max_in(self, lo: float, hi: float) -> float | None:
        """The highest value among the points with lo <= t < hi (None: no point there)."""
        i = self.argmax_in(lo, hi)
        return None if i is None else self.v[i]

    def slice_s(self, i: int) -> float | None:
        """The width of the roll-up slice point i stands for (None: a raw sample)."""
        return self.slice_hi[i] - self.slice_lo[i] if self.rolled(i) else None

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
        i = self.nearest_index(t, max_gap_s)
        return None if i is None else self.v[i]

    def nearest_index(self, t: float, max_gap_s: float | None = None) -> int | None:
        """The index of the point closest to ``t`` (None if the series is empty or too far)."""
        if not self.t:
            return None
        i = bisect.bisect_left(self.t, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(self.t)), key=lambda j: abs(self.t[j] - t))
        if max_gap_s is not None and abs(self.t[best] - t) > max_gap_s:
            return None
        return best

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
        self._series: dict[tuple[str, str, Stat], Series] = {}
        self._sources: dict[str, list[str]] = {}

    def get(self, source: str, metric: str, stat: Stat = "mean") -> Series:
        """The series, its rolled-up slices read as ``stat`` (``max`` for a peak)."""
        key = (source, metric, stat)
        if key not in self._series:
            mean = self._series.get((source, metric, "mean"))
            if stat != "mean" and mean is not None and not mean.any_rolled:
                # Raw samples only: each point is its own mean, lowest and highest.
                self._series[key] = mean
            else:
                r = self._reader.series_rows(metric, source, stat)
                self._series[key] = Series(r.t, r.v, r.n, r.slice_lo, r.slice_hi)
        return self._series[key]

    def peak(self, source: str, metric: str) -> Series:
        """The series for a maximum: each rolled-up slice as its highest sample."""
        return self.get(source, metric, "max")

    def sources(self, metric: str) -> list[str]:
        """Every source that recorded ``metric``."""
        if metric not in self._sources:
            self._sources[metric] = self._reader.sources(metric)
        return self._sources[metric]

    def mean(self, source: str, metric: str, t0: float | None, t1: float | None) -> float | None:
        return self.get(source, metric).mean(t0, t1)
