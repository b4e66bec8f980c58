"""Series look-ups: windows, means, nearest values."""

from __future__ import annotations

import pytest

from stepscope.analysis.samples import Series

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_window_mean_max_nearest() -> None:
    s = Series([0.0, 1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0])
    assert s.window(1.0, 2.0) == [20.0, 30.0]
    assert s.mean(1.0, 2.0) == 25.0 and s.max() == 40.0 and s.min(2.0, None) == 30.0
    assert s.nearest(1.4) == 20.0 and s.nearest(1.6) == 30.0
    assert s.nearest(10.0, max_gap_s=1.0) is None
    assert s.argmax() == (3.0, 40.0)
    empty = Series([], [])
    assert not empty and empty.mean() is None and empty.nearest(0.0) is None
