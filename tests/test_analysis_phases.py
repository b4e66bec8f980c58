"""Per-phase figures and verdicts from hand-made records (real store, real reader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.phases import StepSplit, split_fields, steady_split
from stepscope.analysis.summary import build_summary
from stepscope.store.db import RunReader
from stepscope.store.records import StepRecord
from tests.analysis_runs import CPU_FACTS, PhaseSpec, RunSpec, make_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _phases(tmp_path: Path, *specs: PhaseSpec) -> list[dict[str, Any]]:
    make_run(tmp_path, RunSpec(list(specs), facts=dict(CPU_FACTS)))
    with RunReader(tmp_path) as r:
        return list(build_summary(r)["phases"])


def _step(i: int, warmup: bool, wait: float) -> StepRecord:
    return StepRecord(phase_id=0, step=i, t_start=float(i), wall_s=wait + 0.1, data_wait_s=wait,
                      transfer_s=0.0, compute_s=0.1, other_s=0.0, images=8, warmup=warmup)


def test_warmup_steps_are_kept_out_of_the_fractions() -> None:
    steps = [_step(0, True, 5.0), _step(1, False, 0.1), _step(2, False, 0.1)]
    split, steady = steady_split(steps)
    assert steady and split.steps == 2
    assert split_fields(split)["data_wait_frac"] == pytest.approx(0.5)


def test_warmup_only_phase_falls_back_and_says_so() -> None:
    split, steady = steady_split([_step(0, True, 0.1)])
    assert not steady and split.steps == 1
    assert split_fields(StepSplit())["data_wait_frac"] is None


@pytest.mark.parametrize(("spec", "verdict"), [
    (PhaseSpec(1, data_wait_s=0.3, compute_s=0.1, worker_cpu_pct=98), "input-bound"),
    (PhaseSpec(1, data_wait_s=0.005, compute_s=0.2), "compute-bound"),
    (PhaseSpec(1, data_wait_s=0.005, transfer_s=0.1, compute_s=0.1), "transfer-bound"),
    (PhaseSpec(1, data_wait_s=0.005, compute_s=0.1, other_s=0.08), "overhead-bound"),
])
def test_a_scenario_per_verdict(tmp_path: Path, spec: PhaseSpec, verdict: str) -> None:
    (ph,) = _phases(tmp_path, spec)
    assert ph["verdict"] == verdict
    assert not ph["verdict_weak"]
    assert ph["data_wait_frac"] + ph["transfer_frac"] + ph["compute_frac"] + ph["other_frac"] \
        == pytest.approx(1.0)
    assert (ph["input_cause"] is None) == (verdict != "input-bound")


def test_cause_cpu_from_saturated_workers(tmp_path: Path) -> None:
    (ph,) = _phases(tmp_path, PhaseSpec(1, data_wait_s=0.3, compute_s=0.1, worker_cpu_pct=97,
                                        host_cpu_pct=96))
    assert ph["input_cause"] == "cpu"
    assert ph["worker_cpu_pct"] == [pytest.approx(97.0)] * 2
    assert any("DataLoader workers at 97 %" in e for e in ph["input_evidence"])


@pytest.mark.parametrize(("host", "cause"), [(97, "cpu"), (55, "workers")])
def test_cause_from_the_main_process_when_workers_zero(tmp_path: Path, host: int,
                                                        cause: str) -> None:
    """Loading inline saturates the training process: the cores all busy, more workers cannot
    help (cpu); one of two idle, worker processes would load there (workers)."""
    (ph,) = _phases(tmp_path, PhaseSpec(1, workers=0, data_wait_s=0.3, compute_s=0.1,
                                        main_cpu_pct=99, host_cpu_pct=host))
    assert ph["input_cause"] == cause and ph["workers"] == 0
    assert ph["main_cpu_pct"] == pytest.approx(99.0)


def test_cause_storage_from_cold_reads_and_disk_wait(tmp_path: Path) -> None:
    (ph,) = _phases(tmp_path, PhaseSpec(
        1, data_wait_s=0.3, compute_s=0.1, worker_cpu_pct=10, host_cpu_pct=15,
        read_bytes=400_000_000, rchar_bytes=405_000_000, resident_start=0.0, resident_end=0.7,
        psi_io_pct=60, disk_wait=0.7, disk_busy_pct=99))
    assert ph["input_cause"] == "storage"
    assert ph["disk_wait_frac"] == pytest.approx(0.7)
    assert ph["disk_busy_pct"] == pytest.approx(99.0)


def test_cause_workers_from_idle_workers_and_cached_reads(tmp_path: Path) -> None:
    (ph,) = _phases(tmp_path, PhaseSpec(1, workers=1, data_wait_s=0.3, compute_s=0.1,
                                        worker_cpu_pct=55, host_cpu_pct=40))
    assert ph["input_cause"] == "workers"


def test_io_bytes_residency_cpu_and_throughput(tmp_path: Path) -> None:
    spec = PhaseSpec(1, steps=40, data_wait_s=0.05, compute_s=0.145, other_s=0.005,
                     transfer_s=0.0, read_bytes=300_000_000, rchar_bytes=320_000_000,
                     resident_start=0.1, resident_end=0.9, host_cpu_pct=64)
    (ph,) = _phases(tmp_path, spec)
    assert ph["disk_read_bytes"] == 300_000_000
    assert ph["cache_read_bytes"] == 20_000_000
    assert (ph["dataset_resident_frac_start"], ph["dataset_resident_frac_end"]) == (0.1, 0.9)
    assert ph["seconds"] == pytest.approx(8.0)
    assert ph["images"] == 320 and ph["images_per_s"] == pytest.approx(40.0)
    assert ph["cpu_util_pct"] == pytest.approx(64.0)
    assert ph["gpu_util_pct"] is None
    assert ph["step_ms_per_step"] == pytest.approx(200.0)
    assert ph["data_wait_ms_per_image"] == pytest.approx(50.0 / 8)
    assert ph["steady_steps"] == 38 and ph["warmup_steps"] == 2


def test_insufficient_steps_are_flagged(tmp_path: Path) -> None:
    (ph,) = _phases(tmp_path, PhaseSpec(1, steps=8, data_wait_s=0.3, compute_s=0.1))
    assert ph["verdict"] == "input-bound" and ph["verdict_weak"]
    assert "insufficient steps" in ph["verdict_note"]


def test_loader_cpu_per_image_from_worker_samples(tmp_path: Path) -> None:
    (ph,) = _phases(tmp_path, PhaseSpec(1, steps=40, workers=2, worker_cpu_pct=100,
                                        data_wait_s=0.1, compute_s=0.1, transfer_s=0.0,
                                        other_s=0.0))
    # two workers busy a whole core each for 8 s over 320 images = 50 ms of CPU per image
    assert ph["loader_cpu_ms_per_image"] == pytest.approx(50.0, rel=0.01)
