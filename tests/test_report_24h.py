"""The report of a 24-hour run at 1 Hz (~3.5 M samples, ~260 k steps): at most 5 MB, and at most
10 s of CPU to load its timeline and write it.

Untimed lane: the bound is the CPU seconds of the process that loads and writes (all of that work
is on its threads), which other processes on the machine do not change. The wall-clock figure on
a quiet machine is ``python bench/report_size.py`` (docs/performance.md). Writing the synthetic
run through the real store writer is most of this test's time (~40-60 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import report_size_bench

pytestmark = pytest.mark.untimed


@pytest.mark.slow
def test_24_hour_run_report_is_small_and_cheap(tmp_path: Path) -> None:
    bench = report_size_bench()
    run_dir = bench.write_synthetic_run(tmp_path / "day", hours=24.0)
    size, _, cpu_s = bench.measure(run_dir)
    assert size <= 5_000_000
    assert cpu_s <= 10.0
