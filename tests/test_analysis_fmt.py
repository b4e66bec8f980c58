"""Plain-words number formatting."""

from __future__ import annotations

from stepscope.analysis.fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_ratio, fmt_s


def test_formats() -> None:
    assert fmt_bytes(549_000_000) == "549 MB" and fmt_bytes(6.5e9) == "6.5 GB"
    assert fmt_bytes(0) == "0 B" and fmt_bytes(None) == "unknown"
    assert fmt_pct(0.62) == "62 %" and fmt_pct(0.004) == "0.4 %" and fmt_pct(0.0) == "0 %"
    assert fmt_ms(0.178) == "178 ms" and fmt_ms(0.0025) == "2.5 ms"
    assert fmt_s(3.21) == "3.2 s" and fmt_ratio(2.37) == "2.4×"
