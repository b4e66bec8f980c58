"""A ten-million-step run: how big is run.db, how fast do `report` and `explain` read it?

Writes a synthetic run through the real store writer (``RunWriter``, with its roll-ups and raw
windows as in any run): ``--steps`` steps at ``--steps-per-s`` (10 M at 100 steps/s is 27.8
hours) and ~40 series sampled at 1 Hz over the same span, shaped like the seed's run (an
input-bound training phase, a lighter validation phase, epochs of an hour). Then times ``stepscope report RUN`` and ``stepscope explain RUN`` as
a user runs them (fresh processes, imports included).

Growth per day is measured, not extrapolated from one size: the same run is also written at half
the length, and growth = (size - half size) / (the half's length in days), size being the pages
in use (pages freed by dropped raw rows are reused). The raw windows are bounded, so they cancel
out; what is left is what a day of training adds. Report and explain are timed in wall seconds
and CPU seconds: on a shared machine the wall time also measures the neighbours.

Usage:
    .venv/bin/python bench/long_run_store.py [--steps 10000000] [--steps-per-s 100] [--keep DIR]

The last line is the headline figure as one JSON object: the slower of report and explain, in
seconds, with the growth per day beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stepscope.store.db import RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

T0 = 1_700_000_000.0
MAIN_PID = 4242
WORKERS = 2
EPOCH_S = 3600.0
# Cheap deterministic jitter (no RNG call per value: ten million steps must build in minutes).
JITTER = [0.8 + 0.4 * ((i * 7919) % 101) / 100.0 for i in range(101)]


def _samples(t: float, train: bool, k: int) -> list[Sample]:
    """One 1 Hz tick of ~40 series, the seed run's shape (input-bound train, faster val)."""
    j = JITTER[k % 101]
    cpu = (60.0 if train else 85.0) * j
    host = {"cpu_util_pct": cpu, "mem_total_bytes": 16e9, "mem_used_bytes": 6e9 * j,
            "mem_available_bytes": 9e9, "mem_cached_bytes": 2e9, "mem_shmem_bytes": 1e8,
            "psi_cpu_some_pct": cpu / 4, "psi_io_some_pct": 0.5 * j, "psi_io_full_pct": 0.2,
            "psi_mem_some_pct": 0.0}
    out = [Sample(t, "host", m, v) for m, v in host.items()]
    out += [Sample(t, f"cpu{c}", "cpu_util_pct", cpu * JITTER[(k + c) % 101]) for c in range(4)]
    tree = {"cpu_util_pct": cpu * 3.2, "rss_bytes": 3e9, "uss_bytes": 2.2e9,
            "read_rate_bytes_per_s": 0.0, "cache_read_rate_bytes_per_s": 6e6 * j, "workers": 2.0}
    out += [Sample(t, "tree", m, v) for m, v in tree.items()]
    for i, pid in enumerate(range(MAIN_PID, MAIN_PID + 1 + WORKERS)):
        out += [Sample(t, f"proc:{pid}", "cpu_util_pct", (40.0 if i == 0 else 95.0) * j),
                Sample(t, f"proc:{pid}", "rss_bytes", 1.5e9 if i == 0 else 7e8),
                Sample(t, f"proc:{pid}", "uss_bytes", 1.2e9 if i == 0 else 2e8),
                Sample(t, f"proc:{pid}", "read_bytes", (t - T0) * 1e3)]
    out += [Sample(t, "disk:nvme0n1", "read_bytes_per_s", 1e4 * j),
            Sample(t, "disk:nvme0n1", "busy_pct", 0.1 * j),
            Sample(t, "pagecache", "dataset_resident_frac", 1.0),
            Sample(t, "gpu0", "util_pct", (30.0 if train else 70.0) * j),
            Sample(t, "gpu0", "mem_used_bytes", 6.5e9), Sample(t, "gpu0", "power_w", 60 + 30 * j)]
    return out


def write_long_run(run_dir: Path, steps: int, steps_per_s: float) -> None:
    """Epochs of an hour (5/6 train, 1/6 val), steps at ``steps_per_s``, samples at 1 Hz,
    written in time order as a live run writes them."""
    end = T0 + steps / steps_per_s
    w = RunWriter(run_dir, RunInfo(name=run_dir.name, command="train --synthetic",
                                   device="cuda:0", started=T0, pid=MAIN_PID), clock=lambda: end)
    w.put_process(ProcessInfo(MAIN_PID, 1, "main", "python", T0, end))
    for k in range(WORKERS):
        w.put_process(ProcessInfo(MAIN_PID + 1 + k, MAIN_PID, "worker", "pt_data_worker", T0, end))
    wall = 1.0 / steps_per_s
    phase_id, done, t = 0, 0, T0
    while done < steps:
        epoch = phase_id // 2 + 1
        train = phase_id % 2 == 0
        span = EPOCH_S * (5 / 6 if train else 1 / 6)
        n = min(int(span * steps_per_s), steps - done)
        w.put_phase(PhaseRecord(phase_id, epoch, "train" if train else "val", t, t + n * wall,
                                n, n * 8, 1.0, 1.0, 0, 0, 0, 0, WORKERS))
        for s in range(n):
            j = JITTER[s % 101]
            wait = wall * (0.6 if train else 0.2) * j
            w.add_step(StepRecord(phase_id, s, t + s * wall, wall, wait, wall * 0.02, wall * 0.3,
                                  max(0.0, wall * 0.68 - wait), 8, s < 3))
            if s % int(steps_per_s) == 0:  # one sampler tick per second of steps
                w.add_samples(_samples(t + s * wall, train, s))
            if s % 10_000 == 0:
                # A live run hands the writer 100 steps a second; this loop makes them far
                # faster, so it waits for the writer now and then, as a live run never has to.
                w.flush(timeout_s=600.0)
        t += n * wall
        done += n
        phase_id += 1
    w.close("completed", timeout_s=600.0)  # the final roll-up of millions of rows


def _build(run_dir: Path, steps: int, steps_per_s: float) -> tuple[float, int]:
    t0 = time.perf_counter()
    write_long_run(run_dir, steps, steps_per_s)
    return time.perf_counter() - t0, _db_bytes(run_dir)


def _db_bytes(run_dir: Path) -> int:
    """Bytes of pages in use: pages freed by dropped raw rows are reused, not new growth."""
    con = sqlite3.connect(run_dir / "run.db")
    try:
        pages, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0]
                             for p in ("page_count", "freelist_count", "page_size"))
    finally:
        con.close()
    return int((pages - free) * size)


def _file_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("run.db*"))


def _time_cli(*args: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one CLI command in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "stepscope", *args], check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000_000)
    ap.add_argument("--steps-per-s", type=float, default=100.0)
    ap.add_argument("--keep", type=Path, default=None, help="write the runs here and keep them")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-long-run-") as tmp:
        root = args.keep or Path(tmp)
        half_s, half_bytes = _build(root / "half", args.steps // 2, args.steps_per_s)
        full_s, full_bytes = _build(root / "full", args.steps, args.steps_per_s)
        days = (args.steps - args.steps // 2) / args.steps_per_s / 86400.0
        growth_mb = (full_bytes - half_bytes) / days / 1e6
        print(f"built {args.steps:,} steps in {full_s:.0f} s ({args.steps // 2:,} in {half_s:.0f} s)"
              f"; run.db {full_bytes / 1e6:.1f} MB of pages in use, "
              f"{_file_bytes(root / 'full') / 1e6:.1f} MB on disk with its WAL "
              f"({half_bytes / 1e6:.1f} MB in use at half length)")
        print(f"growth: {growth_mb:.2f} MB per day at {args.steps_per_s:g} steps/s")
        report_s, report_cpu = _time_cli("report", str(root / "full"))
        explain_s, explain_cpu = _time_cli("explain", str(root / "full"))
        print(f"stepscope report: {report_s:.2f} s ({report_cpu:.2f} s CPU); "
              f"stepscope explain: {explain_s:.2f} s ({explain_cpu:.2f} s CPU)")
    print(json.dumps({"figure": "long_run_read_s", "value": round(max(report_s, explain_s), 2),
                      "report_s": round(report_s, 2), "explain_s": round(explain_s, 2),
                      "report_cpu_s": round(report_cpu, 2), "explain_cpu_s": round(explain_cpu, 2),
                      "growth_mb_per_day": round(growth_mb, 2), "db_mb": round(full_bytes / 1e6, 1),
                      "steps": args.steps, "steps_per_s": args.steps_per_s, "runs": 1}))


if __name__ == "__main__":
    main()
