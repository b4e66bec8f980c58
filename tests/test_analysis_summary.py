"""summary.json: the DESIGN.md key contract, JSON round trip, runs without steps, ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.explain import headline
from stepscope.analysis.phases import PhaseTotals
from stepscope.analysis.summary import (
    aggregate_phase_kind,
    build_summary,
    load_summary,
    write_summary,
)
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import RunInfo, Sample, StepRecord
from tests.analysis_runs import CPU_FACTS, T0, PhaseSpec, RunSpec, make_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


PHASE_KEYS = {
    "epoch", "phase", "steps", "images", "seconds", "images_per_s", "data_wait_frac",
    "transfer_frac", "compute_frac", "verdict", "input_cause", "disk_read_bytes",
    "cache_read_bytes", "dataset_resident_frac_start", "dataset_resident_frac_end",
    "cpu_util_pct", "gpu_util_pct",
}
VERDICTS = {"input-bound", "compute-bound", "transfer-bound", "overhead-bound"}


def _two_epochs() -> RunSpec:
    return RunSpec([
        PhaseSpec(1, "train", data_wait_s=0.18, compute_s=0.065, worker_cpu_pct=97,
                  host_cpu_pct=95, read_bytes=440_000_000, rchar_bytes=445_000_000,
                  resident_start=0.0, resident_end=0.8),
        PhaseSpec(1, "val", steps=25, data_wait_s=0.03, compute_s=0.02, checkpoint_s=1.5,
                  read_bytes=110_000_000, rchar_bytes=111_000_000, resident_start=0.8),
        PhaseSpec(2, "train", data_wait_s=0.18, compute_s=0.065, worker_cpu_pct=97,
                  host_cpu_pct=95, rchar_bytes=445_000_000),
        PhaseSpec(2, "val", steps=25, data_wait_s=0.03, compute_s=0.02, checkpoint_s=1.4,
                  rchar_bytes=111_000_000),
    ], facts=dict(CPU_FACTS, **{"monitor.cpu_s": 0.5}))


def test_summary_matches_the_design_contract(tmp_path: Path) -> None:
    make_run(tmp_path, _two_epochs())
    s = write_summary(tmp_path)
    assert s["schema_version"] == 1
    assert {"run", "phases", "memory", "findings", "ranks", "monitor_overhead_frac"} <= set(s)
    assert {"name", "status", "device", "command", "started", "ended"} <= set(s["run"])
    assert s["run"]["status"] == "completed"
    assert len(s["phases"]) == 4
    for ph in s["phases"]:
        assert set(ph) >= PHASE_KEYS
        assert ph["phase"] in {"train", "val"} and ph["verdict"] in VERDICTS
        assert ph["input_cause"] in {"storage", "cpu", "workers", None}
    assert {"device", "total_bytes", "ledger", "unattributed_bytes"} <= set(s["memory"])
    for f in s["findings"]:
        assert {"id", "severity", "title", "evidence", "fix", "expected_gain"} <= set(f)
    assert s["ranks"] == []


def test_summary_json_round_trips_and_is_written_atomically(tmp_path: Path) -> None:
    make_run(tmp_path, _two_epochs())
    s = write_summary(tmp_path)
    assert load_summary(tmp_path) == json.loads(json.dumps(s))
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_epochs_checkpoints_and_by_phase(tmp_path: Path) -> None:
    make_run(tmp_path, _two_epochs())
    with RunReader(tmp_path) as r:
        s = build_summary(r)
    e1, e2 = s["epochs"]
    assert e1["disk_read_bytes"] == 550_000_000 and e2["disk_read_bytes"] == 0
    assert e2["cache_read_bytes"] == 556_000_000
    assert [p["checkpoint_write_s"] for p in s["phases"]] == [None, 1.5, None, 1.4]
    assert s["checkpoints"]["writes"] == 2
    assert s["by_phase"]["train"]["verdict"] == "input-bound"
    assert s["by_phase"]["train"]["input_cause"] == "cpu"
    assert s["by_phase"]["train"]["data_wait_frac"] == pytest.approx(0.72)


def test_monitor_overhead_from_the_sampler_cpu_time(tmp_path: Path) -> None:
    make_run(tmp_path, _two_epochs())
    with RunReader(tmp_path) as r:
        s = build_summary(r)
    assert s["monitor_overhead_frac"] == pytest.approx(0.5 / (s["run"]["seconds"] * 2))


def test_a_run_without_steps_still_has_a_summary_with_a_note(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="watch", command="python script.py", kind="watch",
                                    started=T0, pid=4242), clock=lambda: T0 + 10)
    w.add_samples([Sample(T0 + i, "host", "cpu_util_pct", 40.0 + i) for i in range(10)])
    w.add_samples([Sample(T0 + i, "tree", "rss_bytes", 3e8) for i in range(10)])
    w.close("completed")
    s = write_summary(tmp_path)
    assert s["phases"] == [] and s["by_phase"] == {}
    assert any("no training steps" in n for n in s["notes"])
    assert any(f["id"] == "no_steps" for f in s["findings"])
    assert s["system"]["cpu_util_pct"] == pytest.approx(44.5)
    assert s["memory"]["total_bytes"] == 300_000_000
    assert s["monitor_overhead_frac"] is None


def test_only_this_runs_rank_goes_into_phases(tmp_path: Path) -> None:
    make_run(tmp_path, RunSpec([PhaseSpec(1, rank=0), PhaseSpec(1, rank=1)]))
    with RunReader(tmp_path) as r:
        s = build_summary(r)
    # ranks come from the rank stores (analysis/ranks.py), not from phases in one store
    assert len(s["phases"]) == 1 and s["ranks"] == []


def _steps(phase_id: int, n: int, wait_s: float, compute_s: float) -> list[StepRecord]:
    return [StepRecord(phase_id, i, T0 + i, wait_s + compute_s, wait_s, 0.0, compute_s, 0.0, 8)
            for i in range(n)]


def test_a_kinds_cause_is_the_one_behind_the_most_waiting() -> None:
    # Epoch 1: long, 15 ms of each 45 ms step waited on receiving batches (main-process);
    # epoch 2: shorter, but one restart of its workers waited 1.6 s (workers). The kind's cause
    # is the one that cost the most wait, whatever the phases' lengths.
    e1 = _steps(0, 80, 0.015, 0.030)
    e2 = _steps(1, 40, 0.015, 0.030)
    e2[0] = StepRecord(1, 0, T0, 1.63, 1.6, 0.0, 0.03, 0.0, 8)
    rows: list[Any] = []
    for pid, (epoch, cause, steps) in enumerate([(1, "main-process", e1), (2, "workers", e2)]):
        rows.append({"phase_id": pid, "epoch": epoch, "phase": "train", "images": 8 * len(steps),
                     "seconds": sum(s.wall_s for s in steps), "data_wait_frac": None,
                     "input_cause": cause, "input_evidence": [cause], "gpu_util_pct": None,
                     "cpu_util_pct": None, "loader_cpu_ms_per_image": None, "workers": 2})
    assert rows[0]["seconds"] > rows[1]["seconds"]
    totals = {pid: PhaseTotals.from_steps(s) for pid, s in enumerate([e1, e2])}
    agg = aggregate_phase_kind("train", rows, totals)
    assert agg is not None and agg["verdict"] == "input-bound"
    assert agg["input_cause"] == "workers" and agg["input_evidence"] == ["workers"]


def _compute_bound(facts: dict[str, Any]) -> RunSpec:
    return RunSpec([PhaseSpec(1, "train", data_wait_s=0.0, compute_s=0.1),
                    PhaseSpec(1, "val", steps=25, data_wait_s=0.0, compute_s=0.05)],
                   facts=dict(CPU_FACTS, **facts))


def test_python_gil_share_needs_its_samples(tmp_path: Path) -> None:
    for name, found, frac in (("a", {"samples": 40, "held": 30}, 0.75),
                              ("b", {"samples": 12, "held": 12}, None)):
        make_run(tmp_path / name, _compute_bound({"loop.python_gil": found}))
        s = build_summary(RunReader(tmp_path / name))
        assert s["loader"]["python_gil_held_frac"] == frac
    make_run(tmp_path / "c", _compute_bound({}))
    assert build_summary(RunReader(tmp_path / "c"))["loader"]["python_gil_held_frac"] is None


def test_unclocked_keras_steps_make_the_training_verdict_weak(tmp_path: Path) -> None:
    # A Keras/TensorFlow train function whose graph has no step-end clock: watch timed its
    # graph calls, but no step end reached the graph clock, so its data wait reads 0.
    make_run(tmp_path / "a", _compute_bound({"loop.keras_wait_unclocked": 40}))
    s = build_summary(RunReader(tmp_path / "a"))
    train = [p for p in s["phases"] if p["phase"] == "train"]
    assert train and all(p["verdict_weak"] for p in train)
    assert "data wait was not measured" in (train[0]["verdict_note"] or "")
    assert not any(p["verdict_weak"] for p in s["phases"] if p["phase"] == "val")
    assert s["loader"]["wait_unclocked"] == 40
    _, text = headline(s) or ("", "")
    assert "This verdict is weak: its data wait was not measured" in text
    # measured (no such fact): the same steps, no such sentence
    make_run(tmp_path / "b", _compute_bound({}))
    s = build_summary(RunReader(tmp_path / "b"))
    assert not any(p["verdict_weak"] for p in s["phases"])
    _, text = headline(s) or ("", "")
    assert "not measured" not in text
