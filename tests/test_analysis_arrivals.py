"""Stragglers by arrival at the gradient all-reduce: known arrival patterns, known answers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stepscope.analysis.arrivals import (
    INFERRED,
    MEASURED,
    RankArrivals,
    analyze_arrivals,
    arrival_evidence,
    longest_run,
    recurrence,
)
from stepscope.analysis.ranks import merge_ranks
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import ArrivalRecord, PhaseRecord, RunInfo, StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


T0 = 1_000.0
PERIOD = 0.050
N = 40


def _job(late_s: list[list[float]], hosts: list[str] | None = None, allreduce_s: float = 0.002,
         skew_s: float = 0.0, period_s: float = PERIOD) -> list[RankArrivals]:
    """Ranks arriving at ``T0 + n * PERIOD + late_s[k][n]``; the all-reduce completes
    ``allreduce_s`` after the last arrival. ``skew_s`` shifts rank k's clock by k * skew_s."""
    rng = random.Random(0)
    out = []
    for k, lates in enumerate(late_s):
        arrivals = []
        for n in range(N):
            jitter = rng.uniform(0, 0.001)
            t = T0 + n * period_s + lates[n] + jitter
            done = T0 + n * period_s + max(ls[n] for ls in late_s) + 0.001 + allreduce_s
            arrivals.append(ArrivalRecord(seq=n, t_arrive=t + k * skew_s, wait_s=done - t,
                                          comm_s=done - t, buckets=1))
        out.append(RankArrivals(rank=k, host=(hosts or ["a"] * len(late_s))[k],
                                arrivals=arrivals))
    return out


def test_a_rank_late_at_every_allreduce_is_named() -> None:
    res = analyze_arrivals(_job([[0.0] * N, [0.030] * N]))
    assert res is not None
    assert res["job"]["stragglers"] == [1] and res["job"]["method"] == MEASURED
    row = res["rows"][1]
    assert row["recurrence"] == "every step" and row["arrived_last_frac"] == 1.0
    assert row["late_ms_when_late"] == pytest.approx(30.0, abs=1.5)
    assert res["rows"][0]["recurrence"] == "never"


def test_balanced_job_claims_no_straggler() -> None:
    rng = random.Random(1)
    noise = [[rng.uniform(0, 0.004) for _ in range(N)] for _ in range(3)]
    res = analyze_arrivals(_job(noise))
    assert res is not None and res["job"]["stragglers"] == []
    assert all(r["recurrence"] in ("never", "scattered") for r in res["rows"].values())


def test_one_bad_stretch_is_told_from_every_step() -> None:
    late = [0.0] * N
    for n in range(15, 25):
        late[n] = 0.040
    res = analyze_arrivals(_job([[0.0] * N, late]))
    assert res is not None
    row = res["rows"][1]
    assert row["recurrence"] == "one stretch" and row["arrival_straggler"]
    assert (row["late_stretch"]["first_allreduce"], row["late_stretch"]["last_allreduce"]) == \
        (15, 24)


def test_a_rank_late_by_much_at_half_the_steps_is_named() -> None:
    # Loading whose cost varies batch to batch: rank 1 is 120 ms late at every other all-reduce
    # and 10 ms at the rest, under the 30 ms threshold (a tenth of the 300 ms step). Late at only
    # half of them, but last at all of them: the others wait 65 ms a step for it on average.
    late = [0.120 if n % 2 == 0 else 0.010 for n in range(N)]
    res = analyze_arrivals(_job([[0.0] * N, late], period_s=0.300))
    assert res is not None and res["job"]["stragglers"] == [1]
    row = res["rows"][1]
    assert row["recurrence"] == "most steps"
    assert row["late_allreduce_frac"] == pytest.approx(0.5, abs=0.02)  # warm-up left out
    assert row["late_ms_mean"] == pytest.approx(65.0, abs=2.5)
    assert res["rows"][0]["recurrence"] == "never"
    text = " ".join(arrival_evidence(1, row, res["job"]))  # type: ignore[arg-type]
    assert "arrived last at 100 %" in text
    assert f"waited {row['late_ms_mean']:.1f} ms for it per all-reduce" in text


def test_ranks_taking_turns_to_be_late_claim_no_straggler() -> None:
    # Each rank 120 ms late at every other all-reduce: each arrives last at half of them, so
    # neither is the one the others wait for (the job is slow, not one rank).
    even = [0.120 if n % 2 == 0 else 0.0 for n in range(N)]
    odd = [0.0 if n % 2 == 0 else 0.120 for n in range(N)]
    res = analyze_arrivals(_job([even, odd], period_s=0.300))
    assert res is not None and res["job"]["stragglers"] == []
    assert [r["recurrence"] for r in res["rows"].values()] == ["scattered", "scattered"]


def test_a_rank_rarely_and_briefly_late_is_not_named() -> None:
    # Last at every all-reduce, but by 5 ms, and 25 ms at 40 % of them: the others' mean wait
    # (13 ms) is under the 20 ms floor that scheduling noise on a shared host reaches.
    late = [0.025 if n % 5 < 2 else 0.005 for n in range(N)]
    res = analyze_arrivals(_job([[0.0] * N, late]))
    assert res is not None and res["job"]["stragglers"] == []
    assert res["rows"][1]["recurrence"] == "scattered"


def test_across_hosts_lateness_comes_from_waits_not_clocks() -> None:
    # Rank 1's clock runs 2 s ahead of rank 0's: timestamps would call it late every step.
    res = analyze_arrivals(_job([[0.030] * N, [0.0] * N], hosts=["a", "b"], skew_s=2.0))
    assert res is not None and res["job"]["method"] == INFERRED
    assert res["job"]["stragglers"] == [0]


def test_recurrence_and_runs() -> None:
    assert longest_run([False, True, True, False, True]) == (1, 2)
    assert recurrence([]) == "never"
    assert recurrence([True] * 7 + [False] * 3) == "every step"
    assert recurrence([False] * 10 + [True] * 6 + [False] * 14) == "one stretch"
    assert recurrence([True, False, False] * 10) == "scattered"


def test_without_arrivals_on_every_rank_there_is_no_arrival_verdict() -> None:
    job = _job([[0.0] * N, [0.03] * N])
    job[1].arrivals = []
    assert analyze_arrivals(job) is None


# -- merged with the ranks' step records ----------------------------------------------------------
def _store(run_dir: Path, rank: int, arrivals: list[ArrivalRecord], compute_s: float) -> None:
    """A watched rank without comm separated from compute: every step lasts the same on each
    rank (the all-reduce equalised them), so busy time cannot tell the ranks apart."""
    db = "run.db" if rank == 0 else f"run.rank{rank}.db"
    w = RunWriter(run_dir, RunInfo(name="w", command="t", kind="watch", rank=rank, world_size=2,
                                   started=T0, pid=10 + rank), db_name=db, clock=lambda: T0 + 9)
    w.put_phase(PhaseRecord(phase_id=0, epoch=0, phase="train", started=T0,
                            ended=T0 + N * PERIOD, steps=N, images=8 * N, workers=0, rank=rank))
    for n in range(N):
        w.add_step(StepRecord(phase_id=0, step=n, t_start=T0 + n * PERIOD, wall_s=PERIOD,
                              data_wait_s=0.001, transfer_s=0.0, compute_s=compute_s,
                              other_s=PERIOD - 0.001 - compute_s, images=8, warmup=n < 3))
    for a in arrivals:
        w.add_arrival(a)
    w.fact("dist.host", "a", "test")
    w.close("completed", 0)


def test_merge_names_the_rank_the_others_wait_for_when_busy_time_is_equal(
        tmp_path: Path) -> None:
    job = _job([[0.0] * N, [0.030] * N])
    for r in job:
        _store(tmp_path, r.rank, r.arrivals, compute_s=0.045)
    readers = [RunReader(tmp_path), RunReader(tmp_path, db_name="run.rank1.db")]
    try:
        merged = merge_ranks(readers)
    finally:
        for r in readers:
            r.close()
    rows = merged["ranks"]
    assert [(r["rank"], r["straggler"], r["straggler_by"]) for r in rows] == \
        [(0, False, "arrival"), (1, True, "arrival")]
    assert rows[1]["busy_ratio_to_others"] == pytest.approx(1.0)  # equalised
    assert rows[1]["cause"] is None  # its own split does not say why: no cause claimed
    assert any("arrived last at 100 %" in e for e in rows[1]["straggler_evidence"])
    job_section = merged["distributed"]
    assert job_section["arrival"]["stragglers"] == [1]
    assert job_section["nodes"] == [{"host": "a", "ranks": [0, 1], "stragglers": [1]}]
