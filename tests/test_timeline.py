"""load_timeline: bucketed series keep extremes, steps add up, spans merge past a limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.analysis.timeline import Series, load_timeline, sum_series
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


T0 = 1_000.0


def _write_run(run_dir: Path, *, n_samples: int = 1000, n_steps: int = 40) -> Path:
    # Every sample stays raw here (the window covers the run): bucketing is what is tested;
    # folding old samples into roll-ups is tested in test_rollups.py.
    w = RunWriter(run_dir, RunInfo(name="tl", command="test", started=T0, pid=1),
                  clock=lambda: T0 + n_samples, keep_raw_samples_s=2.0 * n_samples)
    values = [float(i % 10) for i in range(n_samples)]
    values[500] = 1000.0  # a one-sample spike that averaging would hide
    w.add_samples(Sample(T0 + i, "host", "cpu_util_pct", v) for i, v in enumerate(values))
    w.add_samples([Sample(T0 + 10 * i, "pagecache", "dataset_resident_frac", i / 10)
                   for i in range(11)])
    w.put_process(ProcessInfo(1, 0, "main", "python", T0, T0 + n_samples))
    w.put_process(ProcessInfo(2, 1, "worker", "pt_data_worker", T0, T0 + n_samples))
    w.put_phase(PhaseRecord(0, 1, "train", T0, T0 + 400, n_steps, n_steps * 8))
    w.put_phase(PhaseRecord(1, 1, "val", T0 + 400))  # never ended: the run was killed
    for s in range(n_steps):
        w.add_step(StepRecord(0, s, T0 + 10 * s, 1.0, 0.5, 0.1, 0.3, 0.1, 8, warmup=s < 2))
    w.close("interrupted")
    return run_dir


def test_series_are_bounded_and_keep_the_spike(tmp_path: Path) -> None:
    with RunReader(_write_run(tmp_path / "r")) as r:
        tl = load_timeline(r, max_points=100)
    cpu = tl.get("host", "cpu_util_pct")
    assert cpu is not None
    assert len(cpu.t) <= 100 and cpu.n_samples == 1000 and cpu.downsampled
    assert max(cpu.hi) == 1000.0
    assert max(cpu.mean) < 200.0  # the spike is one sample of its bucket
    assert min(cpu.lo) == 0.0
    assert cpu.t == sorted(cpu.t)


def test_sparse_series_keep_every_sample(tmp_path: Path) -> None:
    with RunReader(_write_run(tmp_path / "r")) as r:
        tl = load_timeline(r, max_points=100)
    res = tl.get("pagecache", "dataset_resident_frac")
    assert res is not None and not res.downsampled
    assert res.lo == res.hi == res.mean == [i / 10 for i in range(11)]
    assert tl.sources("cpu_util_pct") == ["host"]


def test_phases_steps_and_processes(tmp_path: Path) -> None:
    with RunReader(_write_run(tmp_path / "r")) as r:
        tl = load_timeline(r, max_points=100)
    assert [(p.epoch, p.phase) for p in tl.phases] == [(1, "train"), (1, "val")]
    assert tl.phases[1].ended == tl.t1  # an unfinished phase runs to the end of the run
    assert tl.steps.n_steps == 40
    for i in range(len(tl.steps.t)):
        parts = (tl.steps.data_wait_mean[i] + tl.steps.transfer_mean[i]
                 + tl.steps.compute_mean[i] + tl.steps.other_mean[i])
        assert parts == pytest.approx(tl.steps.wall_mean[i])
    train = tl.phase_steps[0]
    assert (train.steps, train.images) == (38, 38 * 8)  # warm-up steps left out
    assert train.data_wait_s == pytest.approx(38 * 0.5)
    assert tl.phase_steps[1].steps == 0
    assert {(p.pid, p.role) for p in tl.processes} == {(1, "main"), (2, "worker")}
    assert tl.status == "interrupted"


def test_step_spans_merge_past_the_limit(tmp_path: Path) -> None:
    with RunReader(_write_run(tmp_path / "r")) as r:
        every = load_timeline(r, max_step_spans=100)
        merged = load_timeline(r, max_step_spans=10)
    assert not every.spans_aggregated and len(every.step_spans) == 40
    assert every.step_spans[3].count == 1 and every.step_spans[3].first_step == 3
    assert merged.spans_aggregated and len(merged.step_spans) <= 11
    assert sum(s.count for s in merged.step_spans) == 40
    assert sum(s.data_wait_s for s in merged.step_spans) == pytest.approx(40 * 0.5)


def test_empty_run_loads(tmp_path: Path) -> None:
    RunWriter(tmp_path / "e", RunInfo(name="e", command="x", started=T0), clock=lambda: T0).close()
    with RunReader(tmp_path / "e") as r:
        tl = load_timeline(r)
    assert tl.series == {} and tl.steps.n_steps == 0 and tl.step_spans == []


def test_sum_series_adds_aligned_buckets() -> None:
    a = Series("proc:1", "cpu_util_pct", [0, 1], [0.5, 1.5], [1, 2], [3, 4], [2, 3], 4)
    b = Series("proc:2", "cpu_util_pct", [1, 2], [1.5, 2.5], [10, 20], [10, 20], [10, 20], 2)
    s = sum_series([a, b], "workers", "cpu_util_pct")
    assert s is not None
    assert s.bucket == [0, 1, 2] and s.mean == [2, 13, 20] and s.hi == [3, 14, 20]
    assert sum_series([], "w", "m") is None
