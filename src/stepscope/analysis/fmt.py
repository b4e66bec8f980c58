"""Numbers in plain words: the units a person reads ("549 MB", "62 %", "178 ms").

Bytes use decimal units (1 MB = 10**6 B) because that is how file sizes and the seed's own
figures ("549 MB", "6.5 GB") are quoted.
"""

from __future__ import annotations

_BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def fmt_bytes(n: float | None) -> str:
    """Bytes as a short decimal figure.

    Examples:
        >>> fmt_bytes(549_000_000), fmt_bytes(6.5e9), fmt_bytes(12)
        ('549 MB', '6.5 GB', '12 B')
    """
    if n is None:
        return "unknown"
    sign = "-" if n < 0 else ""
    a = abs(float(n))
    for unit, size in _BYTE_UNITS:
        if a >= size:
            v = a / size
            return f"{sign}{v:.1f} {unit}" if v < 10 else f"{sign}{v:.0f} {unit}"
    return f"{sign}{a:.0f} B"


def fmt_pct(frac: float | None) -> str:
    """A fraction 0-1 as a whole percent ("62 %"); small non-zero values keep one decimal."""
    if frac is None:
        return "unknown"
    p = frac * 100.0
    if 0 < abs(p) < 1:
        return f"{p:.1f} %"
    return f"{p:.0f} %"


def fmt_ms(seconds: float | None) -> str:
    """Seconds shown as milliseconds ("178 ms"), one decimal under 10 ms."""
    if seconds is None:
        return "unknown"
    ms = seconds * 1000.0
    return f"{ms:.1f} ms" if abs(ms) < 10 else f"{ms:.0f} ms"


def fmt_s(seconds: float | None) -> str:
    """Seconds for durations ("3.2 s", "95 s")."""
    if seconds is None:
        return "unknown"
    return f"{seconds:.1f} s" if abs(seconds) < 10 else f"{seconds:.0f} s"


def fmt_ratio(x: float | None) -> str:
    """A speed ratio ("2.4×")."""
    return "unknown" if x is None else f"{x:.1f}×"


def fmt_count(n: int, word: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
