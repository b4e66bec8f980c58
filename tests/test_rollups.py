"""Roll-ups: raw steps and samples kept for a bounded window, every step still counted once."""

from __future__ import annotations

import random
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from stepscope.store import rollups
from stepscope.store.db import RunReader, RunWriter, compact_run
from stepscope.store.records import PhaseRecord, RunInfo, Sample, StepRecord
from tests.conftest import LANE2_WAIT_S

# Counts and equalities of stored figures, never a time: the untimed lane.
pytestmark = pytest.mark.untimed

T0 = 1_700_000_000.0


def _steps(n: int, per_s: float, seed: int = 0) -> list[StepRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        wait, compute = rng.uniform(0.0, 0.02), rng.uniform(0.01, 0.03)
        out.append(StepRecord(0 if i < n // 2 else 1, i, T0 + i / per_s, wait + compute + 0.001,
                              wait, 0.0, compute, 0.001, 8, warmup=i < 3))
    return out


def _write(run: Path, steps: list[StepRecord], keep: int) -> None:
    # each flush waited out (LANE2_WAIT_S): one given up on would let the next batch pile onto
    # it, and the raw-window counts assume one flush's rows at a time
    w = RunWriter(run, RunInfo(name="r", command="x"), commit_every_s=0.01, rollup_every_s=0.0,
                  keep_raw_steps=keep)
    w.put_phase(PhaseRecord(0, 1, "train", T0))
    w.put_phase(PhaseRecord(1, 1, "val", steps[len(steps) // 2].t_start))
    for s in steps:
        w.add_step(s)
        if s.step % 500 == 0:
            w.flush(timeout_s=LANE2_WAIT_S)
    w.close(timeout_s=LANE2_WAIT_S)


def test_totals_exact_and_raw_window_bounded(tmp_path: Path) -> None:
    steps = _steps(6000, per_s=20.0)  # 300 s of steps: 30 ten-second slices
    _write(tmp_path, steps, keep=1000)
    with RunReader(tmp_path) as r:
        totals = {(t.phase_id, t.warmup): t for t in r.aggregates.step_totals()}
        raw = len(r.steps())
    for (phase, warm), t in totals.items():
        mine = [s for s in steps if s.phase_id == phase and s.warmup == warm]
        assert t.steps == len(mine)
        assert abs(t.data_wait_s - sum(s.data_wait_s for s in mine)) < 1e-9
        assert abs(t.compute_s - sum(s.compute_s for s in mine)) < 1e-9
    assert sum(t.steps for t in totals.values()) == 6000
    assert 1000 <= raw < 1000 + 500  # the window, plus at most one pass not yet dropped


def test_rollup_rows_hold_count_sum_min_max_and_percentiles(tmp_path: Path) -> None:
    steps = _steps(2000, per_s=100.0)  # 20 s: two slices per phase boundary
    _write(tmp_path, steps, keep=0)
    con = sqlite3.connect(tmp_path / "run.db")
    rows = con.execute(
        "SELECT phase_id, warmup, bucket, steps, data_wait_sum, data_wait_min, data_wait_max, "
        "data_wait_p50, data_wait_p90, data_wait_p99 FROM step_rollups").fetchall()
    assert sum(r[3] for r in rows) == 2000
    for phase, warm, bucket, n, total, lo, hi, p50, p90, p99 in rows:
        waits = sorted(s.data_wait_s for s in steps if s.phase_id == phase
                       and s.warmup == bool(warm) and int(s.t_start // 10.0) == bucket)
        assert n == len(waits) and abs(total - sum(waits)) < 1e-9
        assert (lo, hi) == (waits[0], waits[-1])
        assert p50 == waits[max(-(-len(waits) * 50 // 100) - 1, 0)]
        assert lo <= p50 <= p90 <= p99 <= hi


def test_reader_counts_each_step_once_while_the_writer_rolls_up(tmp_path: Path) -> None:
    steps = _steps(20_000, per_s=200.0)
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                with RunReader(tmp_path) as r:
                    seen.append(r.aggregates.step_count())
            except Exception:  # the database may not exist yet
                continue

    reader = threading.Thread(target=read)
    reader.start()
    try:
        _write(tmp_path, steps, keep=2000)
    finally:
        stop.set()
        reader.join()
    assert seen and all(0 <= n <= 20_000 for n in seen)
    assert seen == sorted(seen)  # never a step counted twice, then once
    with RunReader(tmp_path) as r:
        assert r.aggregates.step_count() == 20_000


def test_compacting_keeps_every_figure(tmp_path: Path) -> None:
    steps = _steps(3000, per_s=50.0)
    _write(tmp_path, steps, keep=100_000)
    with RunReader(tmp_path) as r:
        before = r.aggregates.step_totals()
        assert len(r.steps()) == 3000  # a short run reads as raw steps only
    compact_run(tmp_path)
    with RunReader(tmp_path) as r:
        after = r.aggregates.step_totals()
        assert r.steps() == []
    for a, b in zip(before, after, strict=True):
        assert (a.phase_id, a.warmup, a.steps, a.images) == (b.phase_id, b.warmup, b.steps, b.images)
        assert abs(a.wall_s - b.wall_s) < 1e-9 and abs(a.t_end - b.t_end) < 1e-9


def test_resumed_run_after_compaction_counts_new_steps(tmp_path: Path) -> None:
    _write(tmp_path, _steps(100, per_s=10.0), keep=100_000)
    compact_run(tmp_path)
    w = RunWriter(tmp_path, RunInfo(name="r", command="x"))
    w.put_phase(PhaseRecord(w.next_phase_id, 2, "train", T0 + 1000))
    w.add_step(StepRecord(w.next_phase_id, 0, T0 + 1000, 1.0, 0.5, 0.0, 0.5, 0.0, 8))
    w.close(timeout_s=LANE2_WAIT_S)
    with RunReader(tmp_path) as r:
        assert r.aggregates.step_count() == 101


def test_old_samples_roll_up_and_keep_their_series(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="s", command="x"), commit_every_s=0.01,
                  rollup_every_s=0.0, keep_raw_samples_s=600.0)
    for k in range(0, 3600, 100):  # one hour at 1 Hz, handed over in 100-s batches
        w.add_samples([Sample(T0 + t, "host", "cpu_util_pct", float(t % 100))
                       for t in range(k, k + 100)])
        w.flush(timeout_s=LANE2_WAIT_S)
    w.close(timeout_s=LANE2_WAIT_S)
    with RunReader(tmp_path) as r:
        t, v = r.series("cpu_util_pct", "host")
        assert r.sample_count() == 3600
        assert ("host", "cpu_util_pct") in r.metrics()
        raw = r._con.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert raw <= 600 + 2 * rollups.SAMPLE_INTERVAL_S  # the window, not the hour
    assert len(t) < 3600 and t == sorted(t)
    assert abs(sum(v[: len(t) - raw]) / (len(t) - raw) - 49.5) < 10.0  # slice means kept
    # Each rolled-up slice also reads as its highest or lowest sample, with its slice's bounds.
    slices: dict[int, list[float]] = {}
    for s in range(3600):
        slices.setdefault(int((T0 + s) // rollups.SAMPLE_INTERVAL_S), []).append(float(s % 100))
    with RunReader(tmp_path) as r:
        hi, lo = (r.aggregates.series_rows("cpu_util_pct", "host", None, None, stat)
                  for stat in ("max", "min"))
    rolled = [i for i, n in enumerate(hi.n) if n > 1]
    assert len(rolled) == len(t) - raw and hi.t == lo.t == t
    for i in rolled:
        k = int(hi.t[i] // rollups.SAMPLE_INTERVAL_S)
        assert (hi.v[i], lo.v[i], hi.n[i]) == (max(slices[k]), min(slices[k]), len(slices[k]))
        assert hi.slice_lo[i] == k * rollups.SAMPLE_INTERVAL_S <= hi.t[i] < hi.slice_hi[i]
    assert all(n == 1 for n in hi.n[len(rolled):]) and hi.v[len(rolled):] == v[len(rolled):]


def _diagnosis(run: Path) -> tuple[list[tuple[Any, ...]], list[str], list[str]]:
    from stepscope.analysis.explain import explain
    from stepscope.analysis.summary import build_summary

    with RunReader(run) as r:
        s = build_summary(r)
    phases = [(p["epoch"], p["phase"], p["verdict"], p["input_cause"], p["steps"],
               p["steady_steps"], round(p["data_wait_frac"], 9), round(p["compute_frac"], 9))
              for p in s["phases"]]
    return phases, [f["id"] for f in s["findings"]], [a.title for a in explain(s)]


def test_diagnosis_from_rollups_matches_raw_steps_on_a_real_run(
        synth80: Path, tmp_path: Path) -> None:
    """A real training run read two ways: from its raw steps, and after every raw step was
    folded into roll-ups. Every verdict, cause, fraction and finding must be the same."""
    import shutil

    from stepscope.train.config import resolve_config
    from stepscope.train.loop import train
    from tests.conftest import data_flags

    run = tmp_path / "raw"
    train(resolve_config({**data_flags(synth80), "weights": "none", "img_size": 64,
                          "epochs": 2, "model": "test_efficientnet", "workers": 0,
                          "augment": "seed", "out": str(run), "feature_cache": False,
                          "interval_s": 0.25}))
    rolled = tmp_path / "rolled"
    shutil.copytree(run, rolled)
    compact_run(rolled)
    with RunReader(rolled) as r:
        assert r.steps() == [] and r.aggregates.step_count() > 0
    raw_view, rolled_view = _diagnosis(run), _diagnosis(rolled)
    assert raw_view[0] and raw_view == rolled_view


def test_a_step_out_of_time_order_is_still_rolled_up_once(tmp_path: Path) -> None:
    # Each slice reads its own rowids, bisected on t_start; a step emitted late (a GPU step
    # resolved after the next CPU step) sits outside its slice's rowids, and the pass is then
    # read slice by slice over the whole range instead. Both ways every step counts once.
    steps = _steps(3000, per_s=100.0)  # 30 s: three slices per pass of many
    late = steps.pop(995)  # t = 9.95 s, the first slice; written among the second slice's steps
    steps.insert(1010, late)
    _write(tmp_path, steps, keep=0)
    con = sqlite3.connect(tmp_path / "run.db")
    rows = con.execute("SELECT phase_id, warmup, bucket, SUM(steps), SUM(data_wait_sum) "
                       "FROM step_rollups GROUP BY 1, 2, 3").fetchall()  # passes add up
    assert sum(r[3] for r in rows) == 3000
    for phase, warm, bucket, n, total in rows:
        mine = [s.data_wait_s for s in steps if s.phase_id == phase
                and s.warmup == bool(warm) and int(s.t_start // 10.0) == bucket]
        assert n == len(mine) and abs(total - sum(mine)) < 1e-9


def test_steps_written_faster_than_they_happened_keep_the_raw_window(tmp_path: Path) -> None:
    # 300 s of steps written in well under the writer's roll-up period: the passes follow the
    # slices the steps finish, not the wall clock, so the raw window holds (one long pass could
    # drop nothing: raw rows go a whole pass at a time).
    w = RunWriter(tmp_path, RunInfo(name="r", command="x"), commit_every_s=3600.0,
                  rollup_every_s=3600.0, keep_raw_steps=1000)
    for s in _steps(6000, per_s=20.0):
        w.add_step(s)
        if s.step % 500 == 0:
            w.flush(timeout_s=LANE2_WAIT_S)
    w.flush(timeout_s=LANE2_WAIT_S)
    with RunReader(tmp_path) as r:
        assert len(r.steps()) <= 1000 + 500 + 200  # the window, one flush, one slice
        assert sum(t.steps for t in r.aggregates.step_totals()) == 6000
    w.close()


def _fold_vs_sql_rows(out_of_order: bool, monkeypatch: pytest.MonkeyPatch
                      ) -> tuple[int, list[list[Any]]]:
    """The same raw rows rolled up twice, at the same moments: by the writer's StepFolder (kept
    as rows go in) and by the SQL pass that reads them back (rollups.roll_up_steps)."""
    rng = random.Random(7)
    rows: list[tuple[Any, ...]] = []
    for i in range(3000):  # 30 s at 100 steps/s: two phases, warm-up steps, three slices
        wait, compute = rng.uniform(0.0, 0.004), rng.uniform(0.001, 0.005)
        loss = None if i % 3 else (float("nan") if i % 300 == 0 else rng.random())
        comm = None if i % 97 == 0 else rng.uniform(0.0, 0.001)
        rows.append((0 if i < 1700 else 1, i, T0 + 5.0 + i / 100.0, wait + compute + 0.001,
                     wait, 0.0, compute, 0.001, 8, i < 3 or 1700 <= i < 1703, comm, loss))
    if out_of_order:  # a step written after the next slice had begun (a late GPU step)
        rows.insert(520, rows.pop(490))
    from stepscope.store import schema, stepfold

    cons = [sqlite3.connect(":memory:") for _ in range(2)]
    for con in cons:
        con.executescript(schema.SCHEMA)
        rollups.prepare_writer(con)
    folder = stepfold.StepFolder()
    folder.resync(cons[0])
    sql_pass, sql_passes = rollups.roll_up_steps, []
    monkeypatch.setattr(rollups, "roll_up_steps", lambda *a, **k: sql_passes.append(sql_pass(*a, **k)))
    i = 0
    while i < len(rows):
        batch = rows[i:i + rng.randint(1, 400)]
        i += len(batch)
        folder.add(cons[0], batch)
        cons[1].executemany(f"INSERT INTO steps VALUES ({','.join('?' * 12)})", batch)
        if rng.random() < 0.3 or i >= len(rows):
            final = i >= len(rows)
            folder.roll_up(cons[0], final=final, keep_raw=600)
            sql_pass(cons[1], final=final, keep_raw=600)
    return len(sql_passes), [sorted(con.execute(f"SELECT {what} FROM {table}").fetchall(),
                   key=lambda r: tuple(-1 if v is None else v for v in r))
            for con in cons for table, what in (("step_rollups", "*"), ("steps", "rowid, *"))]


def test_rollups_kept_as_steps_go_in_equal_those_read_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Every figure of every roll-up row and the raw window the same both ways; a step out of
    # time order sends that pass to SQL, and the folder carries on from what it left.
    for out_of_order in (False, True):
        sql_passes, (folded, folded_raw, read_back, read_back_raw) = _fold_vs_sql_rows(
            out_of_order, monkeypatch)
        assert sql_passes == (1 if out_of_order else 0)
        assert folded_raw == read_back_raw and 600 <= len(folded_raw) < 3000
        assert len(folded) == len(read_back) > 6
        for a, b in zip(folded, read_back, strict=True):  # sums alike up to rounding
            assert list(a) == [pytest.approx(y, rel=1e-12) if isinstance(y, float) else y
                               for y in b]
