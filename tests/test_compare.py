"""compare_summaries: per-phase ratios, data-wait change, verdict changes, memory deltas."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.analysis.compare import compare_summaries, overall_images_per_s

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _phase(epoch: int, phase: str, images: int, seconds: float, wait: float, verdict: str,
           cause: str | None = None) -> dict[str, Any]:
    return {"epoch": epoch, "phase": phase, "steps": images // 8, "images": images,
            "seconds": seconds, "images_per_s": images / seconds, "data_wait_frac": wait,
            "transfer_frac": 0.01, "compute_frac": 0.9 - wait, "verdict": verdict,
            "input_cause": cause}


def _summary(name: str, phases: list[dict[str, Any]], ledger: dict[str, float], total: float,
             findings: list[str]) -> dict[str, Any]:
    return {"schema_version": 1, "run": {"name": name, "status": "completed"}, "phases": phases,
            "memory": {"device": "cpu", "total_bytes": total,
                       "ledger": [{"item": k, "bytes": v, "how_measured": ""}
                                  for k, v in ledger.items()],
                       "unattributed_bytes": total - sum(ledger.values())},
            "findings": [{"id": f} for f in findings]}


A = _summary("base", [_phase(1, "train", 800, 100.0, 0.6, "input-bound", "cpu"),
                      _phase(1, "val", 200, 10.0, 0.1, "compute-bound"),
                      _phase(2, "train", 800, 80.0, 0.5, "input-bound", "cpu")],
             {"weights": 100.0, "activations": 50.0}, 200.0, ["input-bound-cpu", "ckpt-slow"])
B = _summary("workers2", [_phase(1, "train", 800, 40.0, 0.1, "compute-bound"),
                          _phase(1, "val", 200, 8.0, 0.05, "compute-bound")],
             {"weights": 100.0, "optimizer": 30.0}, 210.0, ["ckpt-slow", "gpu-idle"])


def test_per_phase_ratio_and_wait_change() -> None:
    cmp = compare_summaries(A, B)
    assert [(p.epoch, p.phase) for p in cmp.phases] == [(1, "train"), (1, "val")]
    train = cmp.phases[0]
    assert train.ratio == pytest.approx(20.0 / 8.0)
    assert train.data_wait_change == pytest.approx(-0.5)
    assert train.verdict_changed and not cmp.phases[1].verdict_changed
    assert cmp.verdict_changes == [train]
    assert cmp.only_in_a == [(2, "train")] and cmp.only_in_b == []


def test_overall_training_rate_weights_by_time() -> None:
    # 1600 images in 180 s, not the mean of 8 and 10 img/s.
    assert overall_images_per_s(A, "train") == pytest.approx(1600 / 180)
    cmp = compare_summaries(A, B)
    assert cmp.train_ratio == pytest.approx(20.0 / (1600 / 180))
    assert cmp.val_ratio == pytest.approx(25.0 / 20.0)


def test_memory_deltas_and_findings() -> None:
    cmp = compare_summaries(A, B)
    rows = {d.item: (d.a_bytes, d.b_bytes, d.delta_bytes) for d in cmp.memory}
    assert rows["weights"] == (100.0, 100.0, 0.0)
    assert rows["activations"] == (50.0, None, None)
    assert rows["optimizer"] == (None, 30.0, None)
    assert rows["unattributed"] == (50.0, 80.0, 30.0)
    assert (cmp.memory_total_a, cmp.memory_total_b) == (200.0, 210.0)
    assert cmp.findings_resolved == ["input-bound-cpu"] and cmp.findings_new == ["gpu-idle"]


def test_missing_fields_give_none_not_errors() -> None:
    bare = {"phases": [{"epoch": 1, "phase": "train", "images_per_s": None}]}
    cmp = compare_summaries(bare, bare)
    assert cmp.phases[0].ratio is None and cmp.train_ratio is None
    assert cmp.memory == [] and (cmp.a_name, cmp.b_name) == ("a", "b")
