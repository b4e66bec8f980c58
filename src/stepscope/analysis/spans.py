"""Time spans: how much of a window a set of possibly overlapping spans covers."""

from __future__ import annotations

from collections.abc import Iterable


def covered_s(a: float, b: float, spans: Iterable[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` that the union of ``spans`` covers (overlaps counted once).

    Examples:
        >>> covered_s(0.0, 10.0, [(1.0, 3.0), (2.0, 4.0), (8.0, 12.0)])
        5.0
    """
    left, covered = a, 0.0
    for s0, s1 in sorted(spans):
        lo, hi = max(s0, left), min(s1, b)
        if hi > lo:
            covered += hi - lo
            left = hi
    return covered
