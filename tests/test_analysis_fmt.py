"""Plain-words number formatting."""

from __future__ import annotations

import pytest

from stepscope.analysis.fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_ratio, fmt_s

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_formats() -> None:
    assert fmt_bytes(549_000_000) == "549 MB" and fmt_bytes(6.5e9) == "6.5 GB"
    assert fmt_bytes(0) == "0 B" and fmt_bytes(None) == "—"
    assert fmt_pct(0.62) == "62 %" and fmt_pct(0.004) == "0.4 %" and fmt_pct(0.0) == "0 %"
    assert fmt_ms(0.178) == "178 ms" and fmt_ms(0.0025) == "2.5 ms"
    assert fmt_s(3.21) == "3.2 s" and fmt_ratio(2.37) == "2.4×"


def test_one_missing_marker_for_every_figure() -> None:
    from stepscope.analysis import fmt

    missing = {fmt.fmt_bytes(None), fmt.fmt_bytes_per_s(None), fmt.fmt_pct(None),
               fmt.fmt_pct_value(None), fmt.fmt_share(None, 1.0), fmt.fmt_share(1.0, 0.0),
               fmt.fmt_ms(None), fmt.fmt_s(None), fmt.fmt_duration(None), fmt.fmt_ratio(None),
               fmt.fmt_num(None), fmt.fmt_rate(None), fmt.fmt_img_s(None)}
    assert missing == {fmt.MISSING}


def test_shares_and_ratios_read_one_way() -> None:
    from stepscope.analysis.fmt import fmt_pct_value, fmt_rate, fmt_share

    assert fmt_pct_value(98.2) == "98 %" and fmt_share(1, 4) == "25 %"
    assert fmt_ratio(1.347) == "1.35×" and fmt_ratio(12.4) == "12×"
    assert fmt_rate(8.46) == "8.5" and fmt_rate(1385.2) == "1,385"
    assert fmt_bytes(999) == "999 B" and fmt_bytes(999.6) == "1.0 kB"
