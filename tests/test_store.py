"""The run store: WAL database, one writer thread, live readers, SIGKILL survival."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stepscope.errors import StoreError
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord
from stepscope.store.schema import SCHEMA_VERSION


def _step(phase_id: int, i: int) -> StepRecord:
    return StepRecord(phase_id=phase_id, step=i, t_start=100.0 + i, wall_s=1.0, data_wait_s=0.5,
                      transfer_s=0.1, compute_s=0.3, other_s=0.1, images=8)


def test_round_trip(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="r", command="train x", config={"lr": 1e-4}))
    w.put_phase(PhaseRecord(phase_id=0, epoch=0, phase="train", started=1.0))
    for i in range(5):
        w.add_step(_step(0, i))
    w.add_samples([Sample(1.0, "host", "cpu_util_pct", 50.0), Sample(2.0, "host", "cpu_util_pct", 70.0)])
    w.put_process(ProcessInfo(pid=42, ppid=1, role="worker", name="python", first_t=1.0, last_t=2.0))
    w.put_process(ProcessInfo(pid=42, ppid=1, role="worker", name="python", first_t=1.0, last_t=9.0))
    w.note("gpu", "NVML not available")
    w.fact("dataset.bytes", 1234, "os.stat")
    w.put_phase(PhaseRecord(phase_id=0, epoch=0, phase="train", started=1.0, ended=6.0, steps=5))
    w.close("completed")
    r = RunReader(tmp_path)
    info = r.run()
    assert (info.status, info.name, info.config) == ("completed", "r", {"lr": 1e-4})
    assert [p.steps for p in r.phases()] == [5]  # the second put_phase replaced the first
    assert len(r.steps(0)) == 5 and r.steps(0)[0].data_wait_s == 0.5
    assert r.series("cpu_util_pct", "host") == ([1.0, 2.0], [50.0, 70.0])
    assert r.processes()[0].last_t == 9.0
    assert r.notes()[0].text == "NVML not available"
    assert r.facts()["dataset.bytes"].value == 1234
    assert r.metrics() == [("host", "cpu_util_pct")]


def test_reader_sees_live_run(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="live", command="x"), commit_every_s=0.05)
    w.add_step(_step(0, 0))
    w.flush()
    r = RunReader(tmp_path)
    assert r.run().status == "running"
    assert len(r.steps()) == 1
    w.close()


def test_commits_are_batched_at_most_one_period_apart(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="b", command="x"), commit_every_s=0.2)
    w.add_step(_step(0, 0))
    deadline = time.time() + 3.0
    while time.time() < deadline:
        if len(RunReader(tmp_path).steps()) == 1:
            break
        time.sleep(0.05)
    assert len(RunReader(tmp_path).steps()) == 1
    w.close()


def test_sigkill_keeps_records_and_marks_interrupted(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from stepscope.store.db import RunWriter
        from stepscope.store.records import RunInfo, StepRecord
        w = RunWriter(Path({str(tmp_path)!r}), RunInfo(name="k", command="k"), commit_every_s=0.1)
        for i in range(20):
            w.add_step(StepRecord(0, i, 0.0, 1.0, 0.5, 0.1, 0.3, 0.1, 8))
        w.flush()
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    r = RunReader(tmp_path)
    assert r.run().status == "interrupted"
    assert len(r.steps()) == 20
    # The reader also wrote the verdict down, so later reads agree without re-checking.
    con = sqlite3.connect(tmp_path / "run.db")
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no run database"):
        RunReader(tmp_path)
    (tmp_path / "run.db").write_text("this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a readable"):
        RunReader(tmp_path)


def test_schema_version_checked(tmp_path: Path) -> None:
    RunWriter(tmp_path, RunInfo(name="v", command="x")).close()
    con = sqlite3.connect(tmp_path / "run.db")
    con.execute("UPDATE schema_version SET version=?", (SCHEMA_VERSION + 1,))
    con.commit()
    with pytest.raises(StoreError, match="schema version"):
        RunReader(tmp_path)


def test_resume_continues_phase_ids(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="a", command="x"))
    w.put_phase(PhaseRecord(phase_id=0, epoch=0, phase="train", started=1.0))
    w.put_phase(PhaseRecord(phase_id=1, epoch=0, phase="val", started=2.0))
    w.close()
    w2 = RunWriter(tmp_path, RunInfo(name="a", command="x"))
    assert w2.next_phase_id == 2
    w2.close()
    assert json.loads(json.dumps([p.phase for p in RunReader(tmp_path).phases()])) == ["train", "val"]


def test_step_rows_keep_order_with_phases_and_go_in_many_per_insert(tmp_path: Path) -> None:
    # Rows reach the writer through a deque, not the queue: a phase's end queued after its
    # steps must still find them in (and 300 rows cross the 128-rows-per-INSERT batches).
    from dataclasses import astuple, fields

    from stepscope.store import schema

    assert [f.name for f in fields(StepRecord)] == schema.STEP_COLS  # rows are in field order
    w = RunWriter(tmp_path, RunInfo(name="rows", command="x"), commit_every_s=60.0)
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=1.0))
    for i in range(300):
        w.add_step_row(astuple(_step(0, i)))
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=1.0, ended=2.0,
                            steps=300))
    w.close()
    r = RunReader(tmp_path)
    assert [s.step for s in r.steps()] == list(range(300))
    assert r.steps()[7] == _step(0, 7) and r.phases()[0].steps == 300
