"""Numbers in plain words: the one place that decides how a figure reads ("549 MB", "62 %").

Prose (explanations, findings, doctor and tune advice), terminal tables, the live line, the
HTML report and chart axes all format through these functions, so one figure never reads two
ways in one run. The house rules:

- bytes are decimal (1 MB = 10**6 B) because that is how file sizes and the seed's own figures
  ("549 MB", "6.5 GB") are quoted; one decimal under 10 of a unit, none above;
- a share is a whole percent with a space ("62 %"), one decimal when it is below 1 %;
- a ratio ends in "×" ("2.4×"), with two decimals below 2× where small speed-ups matter;
- a figure that was not measured is :data:`MISSING` ("—"); a sentence that needs the figure is
  not printed at all (analysis checks for None before it words a sentence).

Examples:
    >>> fmt_bytes(549_000_000), fmt_pct(0.62), fmt_ratio(2.37), fmt_ms(0.178), fmt_pct(None)
    ('549 MB', '62 %', '2.4×', '178 ms', '—')
"""

from __future__ import annotations

MISSING = "—"

_BYTE_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def fmt_bytes(n: float | None) -> str:
    """Bytes as a short decimal figure.

    Examples:
        >>> fmt_bytes(549_000_000), fmt_bytes(6.5e9), fmt_bytes(12), fmt_bytes(-2e6)
        ('549 MB', '6.5 GB', '12 B', '-2.0 MB')
    """
    if n is None:
        return MISSING
    sign = "-" if n < 0 else ""
    a = abs(float(n))
    for unit, size in _BYTE_UNITS:
        v = a / size
        # 0.9995 and up of a unit would print as "1000" of the unit below: say "1.0 MB" instead.
        if v >= 0.9995:
            return f"{sign}{v:.1f} {unit}" if v < 10 else f"{sign}{v:.0f} {unit}"
    return f"{sign}{a:.0f} B"


def fmt_bytes_per_s(n: float | None) -> str:
    """A byte rate ("1.2 MB/s")."""
    return MISSING if n is None else f"{fmt_bytes(n)}/s"


def fmt_pct(frac: float | None) -> str:
    """A fraction 0-1 as a whole percent ("62 %"); small non-zero values keep one decimal.

    Examples:
        >>> fmt_pct(0.62), fmt_pct(0.004), fmt_pct(0.0)
        ('62 %', '0.4 %', '0 %')
    """
    return MISSING if frac is None else fmt_pct_value(frac * 100.0)


def fmt_pct_value(pct: float | None) -> str:
    """A figure already in percent (``cpu_util_pct`` 98.2 → "98 %"; 250 % = 2.5 cores busy)."""
    if pct is None:
        return MISSING
    if 0 < abs(pct) < 1:
        return f"{pct:.1f} %"
    return f"{pct:.0f} %"


def fmt_share(part: float | None, total: float | None) -> str:
    """``part`` as a share of ``total`` ("25 %"); missing when either is unknown or total is 0."""
    if part is None or not total:
        return MISSING
    return fmt_pct(part / total)


def fmt_ms(seconds: float | None) -> str:
    """Seconds shown as milliseconds ("178 ms"), one decimal under 10 ms, microseconds under
    0.1 ms (where "0.0 ms" would say nothing).

    Examples:
        >>> fmt_ms(0.178), fmt_ms(0.0042), fmt_ms(0.00004), fmt_ms(0.0)
        ('178 ms', '4.2 ms', '40 µs', '0.0 ms')
    """
    if seconds is None:
        return MISSING
    ms = seconds * 1000.0
    if 0 < abs(ms) < 0.1:
        return f"{ms * 1000.0:.0f} µs"
    return f"{ms:.1f} ms" if abs(ms) < 10 else f"{ms:.0f} ms"


def fmt_s(seconds: float | None) -> str:
    """Seconds for durations ("3.2 s", "95 s")."""
    if seconds is None:
        return MISSING
    return f"{seconds:.1f} s" if abs(seconds) < 10 else f"{seconds:.0f} s"


def fmt_time(seconds: float | None) -> str:
    """A duration in milliseconds under a second, else in seconds.

    Examples:
        >>> fmt_time(0.0225), fmt_time(3.84)
        ('22 ms', '3.8 s')
    """
    return fmt_ms(seconds) if seconds is not None and abs(seconds) < 1 else fmt_s(seconds)


def fmt_duration(seconds: float | None) -> str:
    """A wall-clock length as people say it ("3 min 05 s", "1 h 02 min").

    Examples:
        >>> fmt_duration(185), fmt_duration(3725)
        ('3 min 05 s', '1 h 02 min')
    """
    if seconds is None:
        return MISSING
    h, rem = divmod(round(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


def fmt_ratio(x: float | None) -> str:
    """A speed ratio: "1.35×" below 2× (where a few percent matter), "2.4×", "12×".

    Examples:
        >>> fmt_ratio(1.347), fmt_ratio(2.37), fmt_ratio(12.4)
        ('1.35×', '2.4×', '12×')
    """
    if x is None:
        return MISSING
    if abs(x) < 2:
        return f"{x:.2f}×"
    return f"{x:.1f}×" if abs(x) < 10 else f"{x:.0f}×"


def fmt_gain(gain: float) -> str:
    """A predicted speed-up in words; past ~10× the remaining parts are too small to measure
    well, so no more is promised.

    Examples:
        >>> fmt_gain(1.347), fmt_gain(14.0)
        ('~1.35× faster', 'over 10× faster')
    """
    return "over 10× faster" if gain > 10 else f"~{fmt_ratio(gain)} faster"


def ms_of(v: float | None) -> str:
    """A figure the summary keeps in milliseconds (``*_ms_per_step``, ``*_ms_per_image``).

    Examples:
        >>> ms_of(96.0)
        '96 ms'
    """
    return fmt_ms(None if v is None else v / 1000.0)


def fmt_num(v: float | None, digits: int = 1) -> str:
    """A plain number with thousands separators ("1,234.5")."""
    return MISSING if v is None else f"{v:,.{digits}f}"


def fmt_rate(images_per_s: float | None) -> str:
    """Images per second as people quote them: "8.5", "23.5", "1,400".

    Examples:
        >>> fmt_rate(8.46), fmt_rate(23.46), fmt_rate(1385.2)
        ('8.5', '23.5', '1,385')
    """
    if images_per_s is None:
        return MISSING
    return f"{images_per_s:.1f}" if images_per_s < 100 else f"{images_per_s:,.0f}"


def fmt_img_s(images_per_s: float | None) -> str:
    """A throughput with its unit ("8.5 img/s", "1,385 img/s")."""
    return MISSING if images_per_s is None else f"{fmt_rate(images_per_s)} img/s"


def fmt_span(start: str, end: str) -> str:
    """Two formatted figures at a start and an end ("40 %→95 %"); missing when both are."""
    return MISSING if start == end == MISSING else f"{start}→{end}"


def fmt_count(n: int, word: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


__all__ = [
    "MISSING",
    "fmt_bytes",
    "fmt_bytes_per_s",
    "fmt_count",
    "fmt_duration",
    "fmt_gain",
    "fmt_img_s",
    "fmt_ms",
    "fmt_num",
    "fmt_pct",
    "fmt_pct_value",
    "fmt_rate",
    "fmt_ratio",
    "fmt_s",
    "fmt_share",
    "fmt_span",
    "fmt_time",
    "ms_of",
]

