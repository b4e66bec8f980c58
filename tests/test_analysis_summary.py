"""summary.json: the DESIGN.md key contract, JSON round trip, runs without steps, ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepscope.analysis.summary import (
    build_summary,
    load_summary,
    write_summary,
)
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import RunInfo, Sample
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
