"""The report's input-pipeline charts (hand-made summaries)."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.analysis.contracts_summary import PhaseRow
from stepscope.render.input_charts import (
    IMAGES_PER_S_DEFINITION,
    capacity_chart,
    stage_waterfall,
    throughput_chart,
)
from tests.contract_check import assert_conforms

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


COLORS = {"train": "#111111", "val": "#222222"}


def _phase(epoch: int, phase: str, ips: float, **extra: Any) -> dict[str, Any]:
    p = {"epoch": epoch, "phase": phase, "images_per_s": ips, **extra}
    assert_conforms(p, PhaseRow, partial=True)  # a slice of a summary["phases"] row
    return p


def test_waterfall_draws_each_stage_and_says_when_nothing_was_timed() -> None:
    p = _phase(1, "train", 100.0, loader={"stage_ms_per_image": {
        "read": 1.0, "decode": 4.0, "transform": 9.5, "item": 0.1, "collate": 0.3, "pin": 0.0}})
    svg = stage_waterfall({"phases": [p]})
    assert "<svg" in svg and "9.50 ms" in svg and "transform/augment" in svg
    assert "No loader stage timing" in stage_waterfall({"phases": [_phase(1, "train", 1.0)]})


def test_capacity_chart_names_the_binding_stage() -> None:
    p = _phase(1, "train", 50.0, capacity={"consume_images_per_s": 400.0,
                                           "loader_images_per_s": 52.0,
                                           "cpu_images_per_s": 300.0,
                                           "storage_images_per_s": None, "binding": "loader"})
    out = capacity_chart({"phases": [p]})
    assert "1 train: loader" in out and "400 img/s" in out
    assert capacity_chart({"phases": [_phase(1, "train", 1.0)]}) == ""


def test_a_cached_phase_is_clipped_and_marked_and_the_definition_stated() -> None:
    rows = [_phase(1, "train", 110.0), _phase(1, "val", 235.0), _phase(2, "train", 118.0),
            _phase(2, "val", 41_000.0, feature_cache=True)]
    out = throughput_chart({"phases": rows}, COLORS)
    assert "off scale" in out and "epoch 2 val" in out and "feature cache" in out
    assert IMAGES_PER_S_DEFINITION[:40] in out
