"""Merging per-rank stores: per-rank split, communication, stragglers and why, one job verdict.

The stores are real SQLite run databases written with RunWriter, one per rank, with steps shaped
like synchronous DDP: every rank's step ends together, so a fast rank's spare time shows up as
``comm_s`` (waiting in the all-reduce) and a slow rank's as its own data wait or compute.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepscope.analysis.ranks import (
    COMM_S_INCLUDES,
    find_rank_stores,
    merge_ranks,
)
from stepscope.analysis.summary import write_summary
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


T0 = 5_000.0
STEPS = 30
WARMUP = 3


@dataclass
class RankSpec:
    """One rank's own work per step (seconds) and its loader."""

    data_wait_s: float = 0.005
    compute_s: float = 0.050
    workers: int = 2
    main_cpu_pct: float = 40.0
    worker_cpu_pct: float = 60.0
    slow_steps: tuple[int, ...] = ()  # steps where data wait is 10x (a hiccup, not a pattern)


def _own(spec: RankSpec, step: int, rng: random.Random) -> tuple[float, float]:
    jitter = 1.0 + rng.uniform(-0.08, 0.08)
    wait = spec.data_wait_s * (10.0 if step in spec.slow_steps else 1.0)
    return wait * jitter, spec.compute_s * jitter


def make_job(run_dir: Path, specs: list[RankSpec], *, world: int | None = None,
             ranks: list[int] | None = None, comm_floor_s: float = 0.002, seed: int = 0) -> None:
    """Write one store per rank: run.db for rank 0, run.rank<k>.db for the others."""
    rng = random.Random(seed)
    ranks = ranks if ranks is not None else list(range(len(specs)))
    own = [[_own(sp, i, rng) for i in range(STEPS)] for sp in specs]
    # Synchronous: each step lasts as long as the busiest rank, plus the all-reduce itself.
    walls = [max(sum(o[i]) for o in own) + comm_floor_s for i in range(STEPS)]
    for k, spec, mine in zip(ranks, specs, own, strict=True):
        _write_rank(run_dir, k, world or len(specs), spec, mine, walls)


def _write_rank(run_dir: Path, rank: int, world: int, spec: RankSpec,
                own: list[tuple[float, float]], walls: list[float]) -> None:
    pid = 100 + rank
    db = "run.db" if rank == 0 else f"run.rank{rank}.db"
    w = RunWriter(run_dir, RunInfo(name="ddp", command="pytest", started=T0, pid=pid, rank=rank,
                                   world_size=world), db_name=db, clock=lambda: T0 + 100)
    w.put_process(ProcessInfo(pid, 1, "main", "python", T0, T0 + 100))
    workers = list(range(1000 + 10 * rank, 1000 + 10 * rank + spec.workers))
    for wp in workers:
        w.put_process(ProcessInfo(wp, pid, "worker", "pt_data_worker", T0, T0 + 100))
    end = T0 + sum(walls)
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=T0, ended=end,
                            steps=STEPS, images=8 * STEPS, workers=spec.workers, rank=rank,
                            read_bytes_start=0, read_bytes_end=1_000_000 * (rank + 1),
                            rchar_start=0, rchar_end=50_000_000))
    t = T0
    for i, ((wait, compute), wall) in enumerate(zip(own, walls, strict=True)):
        comm = wall - wait - compute - 0.001
        w.add_step(StepRecord(phase_id=0, step=i, t_start=t, wall_s=wall, data_wait_s=wait,
                              transfer_s=0.0005, compute_s=compute, comm_s=comm, other_s=0.0005,
                              images=8, warmup=i < WARMUP))
        t += wall
    samples = []
    s_t = T0 + 0.01
    while s_t < end:
        samples.append(Sample(s_t, f"proc:{pid}", "cpu_util_pct", spec.main_cpu_pct))
        samples += [Sample(s_t, f"proc:{wp}", "cpu_util_pct", spec.worker_cpu_pct) for wp in workers]
        if rank == 0:
            samples.append(Sample(s_t, "host", "cpu_util_pct", 70.0))
        s_t += 0.1
    w.add_samples(samples)
    w.fact("dist.host", "node0", "test")
    w.fact("dist.local_rank", rank, "test")
    w.close("completed")


def _merge(run_dir: Path) -> dict:
    names = ["run.db", *find_rank_stores(run_dir)]
    readers = [RunReader(run_dir, db_name=n) for n in names]
    try:
        return merge_ranks(readers)
    finally:
        for r in readers:
            r.close()


def test_input_straggler_is_named_with_its_loader_evidence(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(), RankSpec(data_wait_s=0.045, workers=0, main_cpu_pct=98.0)])
    merged = _merge(tmp_path)
    r0, r1 = merged["ranks"]
    assert (r0["rank"], r0["straggler"], r0["cause"]) == (0, False, None)
    assert (r1["rank"], r1["straggler"], r1["cause"]) == (1, True, "input")
    assert r1["input_cause"] == "cpu"  # workers=0 and the training process saturated
    evidence = " ".join(r1["straggler_evidence"])
    assert "data wait" in evidence and "workers: 0" in evidence and "98 %" in evidence
    # Synchronous steps: the fast rank waits for the slow one in the all-reduce.
    assert r0["comm_ms_per_step"] > 30 > r1["comm_ms_per_step"]
    assert r1["busiest_step_frac"] == 1.0
    job = merged["distributed"]
    assert job["verdict"] == "straggler-bound" and job["stragglers"] == [1]
    assert "rank 1" in job["verdict_text"] and "data wait" in job["verdict_text"]
    assert job["comm_s_includes"] == COMM_S_INCLUDES
    assert job["world_size"] == 2 and job["missing_ranks"] == []


def test_compute_straggler_among_three(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(), RankSpec(), RankSpec(compute_s=0.09)])
    merged = _merge(tmp_path)
    assert [(r["rank"], r["straggler"], r["cause"]) for r in merged["ranks"]] == [
        (0, False, None), (1, False, None), (2, True, "compute")]
    # Rank 2's node CPU comes from local rank 0's host samples (same host).
    assert merged["ranks"][2]["host_cpu_pct"] == 70.0


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(), RankSpec(), RankSpec(), RankSpec()], seed=3)
    merged = _merge(tmp_path)
    assert not any(r["straggler"] for r in merged["ranks"])
    assert merged["distributed"]["verdict"] == "compute-bound"
    assert "no straggler" in merged["distributed"]["verdict_text"]


def test_a_few_slow_steps_do_not_make_a_straggler(tmp_path: Path) -> None:
    # Three hiccups of 10x data wait on rank 1: slower on average, but not consistently.
    make_job(tmp_path, [RankSpec(), RankSpec(slow_steps=(5, 12, 20))])
    r1 = _merge(tmp_path)["ranks"][1]
    assert not r1["straggler"]
    assert r1["busiest_step_frac"] < 0.6


def test_communication_bound_job(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(compute_s=0.02), RankSpec(compute_s=0.02)], comm_floor_s=0.03)
    merged = _merge(tmp_path)
    assert merged["distributed"]["verdict"] == "communication-bound"
    assert merged["distributed"]["comm_frac"] > 0.4


def test_missing_rank_is_reported(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(), RankSpec()], world=3)
    job = _merge(tmp_path)["distributed"]
    assert job["ranks_recorded"] == [0, 1] and job["missing_ranks"] == [2]


def test_find_rank_stores_orders_by_rank(tmp_path: Path) -> None:
    for k in (10, 2, 1):
        (tmp_path / f"run.rank{k}.db").write_bytes(b"")
    assert find_rank_stores(tmp_path) == ["run.rank1.db", "run.rank2.db", "run.rank10.db"]


def test_write_summary_merges_the_rank_stores(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec(), RankSpec(data_wait_s=0.045, workers=0, main_cpu_pct=98.0)])
    s = write_summary(tmp_path)
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    for r in s["ranks"]:  # the DESIGN.md contract keys
        assert {"rank", "images_per_s", "data_wait_frac", "straggler", "cause"} <= set(r)
    assert s["distributed"]["verdict"] == "straggler-bound"
    assert s["findings"][0]["id"] == "straggler-rank1"
    assert "faster" in s["findings"][0]["expected_gain"]
    # The primary rank's own sections stay its own.
    assert {p["rank"] for p in s["phases"]} == {0}


def test_single_process_summary_is_untouched(tmp_path: Path) -> None:
    make_job(tmp_path, [RankSpec()])
    s = write_summary(tmp_path)
    assert s["ranks"] == [] and "distributed" not in s
