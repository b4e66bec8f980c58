"""The run's time budget (analysis/budget.py): its parts add up to the run, and each part is
said only where it was measured. Hand-made summaries with only the keys it reads."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stepscope.analysis import budget
from stepscope.analysis.summary import _uncovered

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _phase(kind: str, t0: float, t1: float, warm_s: float = 0.0) -> dict[str, Any]:
    return {"phase": kind, "rank": None, "started": t0, "ended": t1, "seconds": t1 - t0,
            "warmup_steps": 3 if warm_s else 0, "warmup_s": warm_s}


def _summary(**kw: Any) -> dict[str, Any]:
    """100 s from t=1000: 10 s of start-up, two epochs of 30 s training and 5 s validation with
    5 s between them, 15 s after the last; 4 s of checkpoint writes outside the phases."""
    s: dict[str, Any] = {
        "run": {"started": 1000.0, "seconds": 100.0, "rank": None},
        "phases": [_phase("train", 1010, 1040, warm_s=6.0), _phase("val", 1040, 1045, 1.0),
                   _phase("train", 1050, 1080), _phase("val", 1080, 1085)],
        "checkpoints": {"writes": 2, "total_s": 4.0, "between_phases_s": 4.0},
    }
    s.update(kw)
    return s


def _seconds(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) s\b", text)]


def test_the_parts_add_up_to_the_run() -> None:
    title, text = budget.answer(_summary())  # type: ignore[misc]
    assert title == "Where the run's time went"
    assert text.startswith("The run took 100 s: 10 s before the first phase began")
    assert "60 s in 2 training phases and 10 s in 2 validation phases" in text
    assert "20 s between the phases and after the last, 4.0 s of it writing checkpoints" in text
    assert "Warm-up steps took 6.0 s of the training and 1.0 s of the validation" in text
    before, train, val, outside = _seconds(text)[1:5]
    assert before + train + val + outside == pytest.approx(100.0)


def test_each_part_only_where_measured() -> None:
    s = _summary(checkpoints={"writes": 0, "total_s": 0.0, "between_phases_s": 0.0})
    for p in s["phases"]:
        p["warmup_s"] = 0.0
    text = budget.answer(s)[1]  # type: ignore[index]
    assert "checkpoint" not in text and "Warm-up" not in text
    assert budget.answer(_summary(phases=[])) is None  # no phase: nothing to set against
    assert budget.answer(_summary(run={"started": 1000.0, "seconds": None})) is None


def test_a_write_counts_only_where_no_phase_covers_it() -> None:
    spans = [(0.0, 10.0), (5.0, 12.0), (20.0, 30.0)]  # overlapping phases (two ranks)
    assert _uncovered(11.0, 14.0, spans) == pytest.approx(2.0)
    assert _uncovered(2.0, 8.0, spans) == pytest.approx(0.0)
    assert _uncovered(15.0, 25.0, spans) == pytest.approx(5.0)


def test_a_validation_inside_an_open_training_phase_is_counted_once() -> None:
    """Lightning's val_check_interval: the training phase stays open around its validations."""
    s = _summary(phases=[_phase("train", 1010, 1080), _phase("val", 1030, 1035),
                         _phase("val", 1075, 1080)], checkpoints={"writes": 0})
    text = budget.answer(s)[1]  # type: ignore[index]
    assert "60 s in 1 training phase and 10 s in 2 validation phases" in text
    assert "20 s between the phases and after the last" in text


def test_the_start_is_split_where_the_framework_import_finished() -> None:
    """watch's import hook timed `import torch` (and Keras's backend inside `import keras`): the
    10 s before the first phase split there, at the last such import before it."""
    run = {"started": 1000.0, "seconds": 100.0, "rank": None,
           "imports_done": {"tensorflow": 1003.0, "keras": 1003.5, "jax": 1095.0}}
    text = budget.answer(_summary(run=run))[1]  # type: ignore[index]
    assert ("10 s before the first phase began (3.5 s until `import keras` finished, as "
            "watch's import hook timed it: the interpreter and the imports up to it; 6.5 s "
            "after it: the script's other imports, building the model and its input)") in text
    # no import timed before the first phase (an older run, or none hooked): not split
    for done in (None, {"jax": 1095.0}):
        text = budget.answer(_summary(run={**run, "imports_done": done}))[1]  # type: ignore[index]
        assert "not split further" in text and "import" in text and "`import" not in text
