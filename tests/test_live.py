"""`stepscope top`: a snapshot of a run still being written, rendered."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from stepscope.analysis.live import snapshot
from stepscope.render.live import top_view
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord


def test_snapshot_of_a_live_run(tmp_path: Path) -> None:
    now = time.time()
    w = RunWriter(tmp_path, RunInfo(name="live", command="train"), commit_every_s=0.05)
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=now - 5))
    for i in range(4):
        w.add_step(StepRecord(0, i, now - 4 + i, 1.0, 0.6, 0.1, 0.3, 0.0, 8))
    w.add_samples([Sample(now - 2, "host", "cpu_util_pct", 40.0),
                   Sample(now - 1, "host", "cpu_util_pct", 95.0),
                   Sample(now - 1, "proc:7", "cpu_util_pct", 180.0)])
    w.put_process(ProcessInfo(7, 1, "main", "python", now - 5, now - 1))
    w.flush()
    with RunReader(tmp_path) as r:
        snap = snapshot(r, now=now)
    w.close()
    assert (snap.status, snap.epoch, snap.phase, snap.phase_steps) == ("running", 1, "train", 4)
    assert snap.images_per_s == 8.0 and abs((snap.data_wait_frac or 0) - 0.6) < 1e-9
    assert snap.latest["host/cpu_util_pct"] == 95.0  # the newest value, not the first
    assert snap.processes == [(7, "main", 180.0, None)]
    console = Console(width=80, record=True, color_system=None)
    console.print(top_view(snap))
    text = console.export_text()
    assert "epoch 1 train: 4 steps, 32 images" in text
    assert "60 %" in text and "95 %" in text and "180 %" in text
