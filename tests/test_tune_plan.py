"""tune's budget planner on a fake clock: shares, run lengths, and skipping what cannot fit."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stepscope.train import tune_plan as tp
from stepscope.train.tune import Candidate, _RunPlan, _try_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_budget_counts_from_its_start_on_the_given_clock() -> None:
    clock = FakeClock()
    b = tp.Budget(120.0, clock)
    clock.now += 30.0
    assert (b.elapsed(), b.left(), b.fraction()) == (30.0, 90.0, 0.25)
    assert b.stage_left(tp.COMPUTE_SHARE) == 120.0 * tp.COMPUTE_SHARE - 30.0
    clock.now += 500.0
    assert b.fraction() == 1.0 and b.left() < 0
    assert tp.Budget(0.0, clock).fraction() == 1.0


def test_run_length_fits_the_share_within_its_bounds() -> None:
    low = tp.min_run_steps()
    assert tp.plan_steps(1e6, 0.0, 1e6, 8, epoch_steps=1000) == tp.MAX_RUN_STEPS
    assert tp.plan_steps(0.1, 5.0, 10.0, 8, epoch_steps=1000) == low  # never under warm-up + 3
    assert tp.plan_steps(1e6, 0.0, 1e6, 8, epoch_steps=2) == low  # a tiny dataset: still low
    # 30 s share, 2 s overhead, 40 img/s at batch 8: (30 / 1.5 - 2) * 40 / 8 = 90 -> capped 60
    assert tp.plan_steps(30.0, 2.0, 40.0, 8, epoch_steps=1000) == 60
    assert tp.plan_steps(9.0, 2.0, 40.0, 8, epoch_steps=1000) == 20  # (6 - 2) * 5


def test_a_run_that_cannot_fit_is_skipped_with_its_arithmetic(tmp_path: Path) -> None:
    clock = FakeClock()
    budget = tp.Budget(10.0, clock)
    clock.now += 8.0  # 2 s left, 1 s of it reserved
    calls: list[Any] = []
    plan = _RunPlan(SimpleNamespace(batch_size=8), budget, tmp_path, epoch_steps=10,  # type: ignore[arg-type]
                    overhead_s=2.0, fallback_rate=4.0, read_rate=lambda p: calls.append(p))  # type: ignore[arg-type,return-value]
    cand = Candidate(1, 2, "fused", "fp32", True)
    _try_run(plan, cand, None, baseline=True, share=1, say=calls.append)
    (row,) = plan.rows
    need = tp.run_need_s(2.0, 8, 4.0)  # 1.5 * (2 + 6 * 8 / 4) = 21 s
    assert need == 21.0
    assert row.skipped == "needs ~21 s, 1 s left" and row.baseline and calls == []


def test_the_baseline_run_alone_hands_its_store_to_the_capacity_curve_reader(
        tmp_path: Path, monkeypatch: Any) -> None:
    from stepscope.train import tune as tuning

    monkeypatch.setattr(tuning, "_real_run", lambda *args: None)  # no training: the wiring only
    read: list[Path] = []

    def read_curve(run_dir: Path) -> dict[str, float]:
        read.append(run_dir)
        return {"2": 1.5}

    plan = _RunPlan(SimpleNamespace(batch_size=8), tp.Budget(1e6, FakeClock()), tmp_path,  # type: ignore[arg-type]
                    epoch_steps=10, overhead_s=0.5, fallback_rate=100.0,
                    read_rate=lambda p: ([10.0, 11.0, 12.0], 0.1, 1.0, 5), read_curve=read_curve)
    _try_run(plan, Candidate(1, 2, "fused", "fp32", True), None, baseline=True, share=2,
             say=lambda s: None)
    _try_run(plan, Candidate(2, 2, "fused", "fp32", True), None, baseline=False, share=1,
             say=lambda s: None)
    assert read == [tmp_path / "run0"] and plan.baseline_curve == {"2": 1.5}
    assert [r.images_per_s for r in plan.rows] == [11.0, 11.0]


def test_an_unreadable_baseline_costs_the_prediction_not_the_tune(
        tmp_path: Path, monkeypatch: Any) -> None:
    from stepscope.errors import StepscopeError
    from stepscope.train import tune as tuning

    monkeypatch.setattr(tuning, "_real_run", lambda *args: None)

    def read_curve(run_dir: Path) -> dict[str, float]:
        raise StepscopeError(f"{run_dir}: no run database")

    said: list[str] = []
    plan = _RunPlan(SimpleNamespace(batch_size=8), tp.Budget(1e6, FakeClock()), tmp_path,  # type: ignore[arg-type]
                    epoch_steps=10, overhead_s=0.5, fallback_rate=100.0,
                    read_rate=lambda p: ([10.0, 11.0, 12.0], 0.1, 1.0, 5), read_curve=read_curve)
    _try_run(plan, Candidate(1, 2, "fused", "fp32", True), None, baseline=True, share=2,
             say=said.append)
    assert plan.baseline_curve == {} and plan.rows[0].images_per_s == 11.0
    assert any("no capacity prediction" in s for s in said)
