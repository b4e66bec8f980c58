"""Chrome trace: valid Trace Event JSON, steps with nested parts, counters per process, bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.timeline import Timeline, load_timeline
from stepscope.render.trace import MACHINE_PID, MAX_POINTS, MAX_STEPS, TID_STEPS, write_trace
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


T0 = 5_000.0


def _run(run_dir: Path, n_steps: int = 50) -> Path:
    w = RunWriter(run_dir, RunInfo(name="tr", command="test", started=T0, pid=10),
                  clock=lambda: T0 + 100)
    w.put_process(ProcessInfo(10, 1, "main", "python", T0, T0 + 100))
    w.put_process(ProcessInfo(11, 10, "worker", "pt_data_worker", T0, T0 + 100))
    w.put_phase(PhaseRecord(0, 1, "train", T0, T0 + n_steps, n_steps, 8 * n_steps))
    for s in range(n_steps):
        w.add_step(StepRecord(0, s, T0 + s, 1.0, 0.4, 0.1, 0.3, 0.2, 8, warmup=s == 0))
    w.add_samples(Sample(T0 + i, "proc:11", "cpu_util_pct", 95.0) for i in range(100))
    w.add_samples(Sample(T0 + i, "host", "cpu_util_pct", 60.0) for i in range(100))
    w.close("completed")
    return run_dir


def _tl(r: RunReader, max_steps: int = MAX_STEPS) -> Timeline:
    return load_timeline(r, max_points=MAX_POINTS, max_step_spans=max_steps)


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_trace_is_valid_trace_event_json(tmp_path: Path) -> None:
    with RunReader(_run(tmp_path / "r")) as r:
        doc = _load(write_trace(tmp_path / "trace.json", _tl(r)))
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    for e in events:
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    assert doc["otherData"]["steps_merged"] is False


def test_steps_nest_their_parts_in_order(tmp_path: Path) -> None:
    with RunReader(_run(tmp_path / "r")) as r:
        events = _load(write_trace(tmp_path / "t.json", _tl(r)))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    parts = [e for e in events if e.get("cat") == "step-part"]
    assert len(steps) == 50 and len(parts) == 200
    first = steps[1]
    assert first["name"] == "step 1" and first["tid"] == TID_STEPS
    assert first["ts"] == pytest.approx(1e6) and first["dur"] == pytest.approx(1e6)
    inner = [p for p in parts if first["ts"] <= p["ts"] < first["ts"] + first["dur"]]
    assert [p["name"] for p in inner] == ["data wait", "copy", "compute", "other"]
    assert [p["dur"] for p in inner] == pytest.approx([4e5, 1e5, 3e5, 2e5])
    assert inner[-1]["ts"] + inner[-1]["dur"] <= first["ts"] + first["dur"] + 1
    phases = [e for e in events if e.get("cat") == "phase"]
    assert [p["name"] for p in phases] == ["epoch 1 train"]


def test_worker_gets_its_own_counter_track(tmp_path: Path) -> None:
    with RunReader(_run(tmp_path / "r")) as r:
        events = _load(write_trace(tmp_path / "t.json", _tl(r)))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names[11].startswith("worker: pt_data_worker") and names[10].startswith("main")
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters if e["name"] == "cpu_util_pct"} == {11}
    assert {e["name"] for e in counters if e["pid"] == MACHINE_PID} == {"host cpu_util_pct"}


def test_many_steps_are_merged_and_said_so(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "r", n_steps=100)
    with RunReader(run_dir) as r:
        doc = _load(write_trace(tmp_path / "t.json", _tl(r, max_steps=10)))
        tl = load_timeline(r)
    steps = [e for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert len(steps) <= 11 and sum(e["args"]["steps"] for e in steps) == 100
    assert doc["otherData"]["steps_merged"] is True and "merged" in doc["otherData"]["note"]
    # A ready Timeline works too, and keeps every step.
    doc2 = _load(write_trace(tmp_path / "t2.json", tl))
    assert len([e for e in doc2["traceEvents"] if e.get("cat") == "step"]) == 100
