"""How big and how slow is the HTML report of a 24-hour run sampled at 1 Hz?

Writes a synthetic run through the real store writer (~86,400 samples x ~42 metrics, ~260,000
steps, 24 epochs of train + val), then times ``load_timeline`` + ``write_report`` and measures
report.html. The last line is the headline figure as one JSON object.

Usage:
    .venv/bin/python bench/report_size.py [--hours 24] [--runs 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from stepscope.analysis.timeline import load_timeline
from stepscope.render.html import write_report
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

T0 = 1_700_000_000.0
MAIN_PID = 4242


def _phase_plan(hours: float, epochs: int) -> list[tuple[int, str, float, float]]:
    """(epoch, phase, start, end): each epoch is 5/6 train and 1/6 validation."""
    epoch_s = hours * 3600.0 / epochs
    plan = []
    for e in range(epochs):
        start = T0 + e * epoch_s
        split = start + epoch_s * 5 / 6
        plan += [(e + 1, "train", start, split), (e + 1, "val", split, start + epoch_s)]
    return plan


def _phase_at(plan: list[tuple[int, str, float, float]], t: float) -> tuple[int, str]:
    for epoch, phase, start, end in plan:
        if start <= t < end:
            return epoch, phase
    return plan[-1][0], plan[-1][1]


def _samples_at(t: float, epoch: int, phase: str, cores: int, workers: int,
                rng: random.Random) -> list[Sample]:
    """One sampler tick: the shape of the seed's run (input-bound train, faster val)."""
    train = phase == "train"
    cpu = (60.0 if train else 85.0) + rng.uniform(-10, 10)
    disk_rate = (2.0e6 if epoch == 1 else 0.0) * (1.0 if train else 2.2) * rng.uniform(0.5, 1.5)
    out = [Sample(t, "host", "cpu_util_pct", cpu)]
    out += [Sample(t, f"cpu{c}", "cpu_util_pct", min(100.0, cpu + rng.uniform(-25, 25)))
            for c in range(cores)]
    host = {"mem_total_bytes": 16e9, "mem_used_bytes": 6e9 + rng.uniform(0, 2e8),
            "mem_available_bytes": 9e9, "mem_cached_bytes": 2e9 + min(t - T0, 3600) * 1.5e5,
            "mem_shmem_bytes": 1e8, "psi_cpu_some_pct": cpu / 4, "psi_io_some_pct": disk_rate / 1e6,
            "psi_io_full_pct": disk_rate / 2e6, "psi_mem_some_pct": 0.0}
    out += [Sample(t, "host", k, v) for k, v in host.items()]
    tree = {"cpu_util_pct": cpu * cores / 100 * 80, "rss_bytes": 3e9, "uss_bytes": 2.2e9,
            "read_rate_bytes_per_s": disk_rate, "cache_read_rate_bytes_per_s": 6e6 - disk_rate,
            "workers": float(workers)}
    out += [Sample(t, "tree", k, v) for k, v in tree.items()]
    for i, pid in enumerate([MAIN_PID] + [MAIN_PID + 1 + w for w in range(workers)]):
        out += [Sample(t, f"proc:{pid}", "cpu_util_pct", (40.0 if i == 0 else 95.0)
                       + rng.uniform(-5, 5)),
                Sample(t, f"proc:{pid}", "rss_bytes", 1.5e9 if i == 0 else 7e8),
                Sample(t, f"proc:{pid}", "uss_bytes", 1.2e9 if i == 0 else 2e8),
                Sample(t, f"proc:{pid}", "read_bytes", (t - T0) * 1e3)]
    out += [Sample(t, "disk:nvme0n1", "read_bytes_per_s", disk_rate * 1.1),
            Sample(t, "disk:nvme0n1", "write_bytes_per_s", 1e4),
            Sample(t, "disk:nvme0n1", "busy_pct", disk_rate / 1e5),
            Sample(t, "pagecache", "dataset_resident_frac", min(1.0, (t - T0) / 3600.0))]
    gpu = (30.0 if train else 70.0) + rng.uniform(-8, 8)
    out += [Sample(t, "gpu0", "util_pct", gpu), Sample(t, "gpu0", "mem_used_bytes", 6.5e9),
            Sample(t, "gpu0", "mem_total_bytes", 8e9), Sample(t, "gpu0", "power_w", 60 + gpu)]
    return out


def _write_steps(w: RunWriter, plan: list[tuple[int, str, float, float]],
                 steps_per_s: float, rng: random.Random) -> None:
    for pid, (epoch, phase, start, end) in enumerate(plan):
        n = int((end - start) * steps_per_s)
        wall = (end - start) / max(n, 1)
        w.put_phase(PhaseRecord(pid, epoch, phase, start, end, n, n * 8,
                                0.0 if epoch == 1 else 1.0, 1.0, 0, 0, 0, 0, 2))
        for s in range(n):
            wait = wall * (0.6 if phase == "train" else 0.2) * rng.uniform(0.8, 1.2)
            copy = wall * 0.02
            compute = wall * 0.3
            w.add_step(StepRecord(pid, s, start + s * wall, max(wall, wait + copy + compute),
                                  wait, copy, compute, max(0.0, wall - wait - copy - compute), 8,
                                  warmup=s < 3))


def write_synthetic_run(run_dir: Path, *, hours: float = 24.0, hz: float = 1.0, epochs: int = 24,
                        cores: int = 4, workers: int = 2, steps_per_s: float = 3.0,
                        seed: int = 0) -> Path:
    """Write a run database shaped like the seed's run; return ``run_dir``."""
    rng = random.Random(seed)
    plan = _phase_plan(hours, epochs)
    end = T0 + hours * 3600.0
    w = RunWriter(run_dir, RunInfo(name=run_dir.name, command="train --synthetic", device="cuda:0",
                                   started=T0, pid=MAIN_PID), clock=lambda: end)
    try:
        w.put_process(ProcessInfo(MAIN_PID, 1, "main", "python", T0, end))
        for k in range(workers):
            w.put_process(ProcessInfo(MAIN_PID + 1 + k, MAIN_PID, "worker", "pt_data_worker",
                                      T0, end))
        n_ticks = int(hours * 3600.0 * hz)
        batch: list[Sample] = []
        for i in range(n_ticks):
            t = T0 + i / hz
            epoch, phase = _phase_at(plan, t)
            batch += _samples_at(t, epoch, phase, cores, workers, rng)
            if len(batch) > 50_000:
                w.add_samples(batch)
                batch = []
        w.add_samples(batch)
        _write_steps(w, plan, steps_per_s, rng)
        w.note("gpu", "synthetic run: values are generated, not measured")
    finally:
        # 3.5 M samples queue faster than SQLite takes them: wait for all of it, or the report
        # is timed while the writer is still rolling up in the background.
        w.close("completed", timeout_s=600.0)
    return run_dir


def _summary_for(reader: RunReader) -> dict[str, object]:
    """A small hand-made summary: the report needs one, the bench measures the timeline part."""
    phases = []
    for p in reader.phases():
        secs = (p.ended or p.started) - p.started
        train = p.phase == "train"
        phases.append({
            "epoch": p.epoch, "phase": p.phase, "steps": p.steps, "images": p.images,
            "seconds": secs, "images_per_s": p.images / secs if secs else None,
            "data_wait_frac": 0.6 if train else 0.2, "transfer_frac": 0.02,
            "compute_frac": 0.3 if train else 0.7,
            "verdict": "input-bound" if train else "compute-bound",
            "input_cause": "cpu" if train else None,
            "disk_read_bytes": 5e8 if p.epoch == 1 else 0, "cache_read_bytes": 5e8,
            "dataset_resident_frac_start": p.resident_frac_start,
            "dataset_resident_frac_end": p.resident_frac_end,
            "cpu_util_pct": 60.0, "gpu_util_pct": 30.0 if train else 70.0})
    run = reader.run()
    return {"schema_version": 1,
            "run": {"name": run.name, "status": run.status, "device": run.device,
                    "command": run.command, "started": run.started, "ended": run.ended},
            "phases": phases, "memory": {"device": "cuda:0", "total_bytes": 6.5e9, "ledger": [
                {"item": "weights", "bytes": 2.2e8, "how_measured": "parameters"}],
                "unattributed_bytes": 6.28e9},
            "findings": [], "ranks": [], "monitor_overhead_frac": 0.01}


def measure(run_dir: Path) -> tuple[int, float, float]:
    """Bytes of report.html, and the seconds (wall, then this process's CPU) to load the
    timeline and write the report. The CPU seconds are the work itself, whatever else the
    machine runs: all of it is done on this process's threads (SQLite reads, rendering)."""
    t0, c0 = time.perf_counter(), time.process_time()
    with RunReader(run_dir) as reader:
        timeline = load_timeline(reader)
        summary = _summary_for(reader)
    path = write_report(run_dir / "report.html", summary, timeline, [], {"synthetic": True})
    return path.stat().st_size, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.keep or Path(tmp) / "run24h"
        if not (run_dir / "run.db").exists():
            t0 = time.perf_counter()
            write_synthetic_run(run_dir, hours=args.hours)
            print(f"wrote synthetic run in {time.perf_counter() - t0:.1f} s: {run_dir}")
        sizes, secs = [], []
        for _ in range(args.runs):
            size, sec, cpu = measure(run_dir)
            sizes.append(size)
            secs.append(sec)
            print(f"report.html {size / 1e6:.2f} MB in {sec:.2f} s ({cpu:.2f} s of CPU)")
        print(json.dumps({"figure": "report_seconds_24h", "value": round(max(secs), 2),
                          "min": round(min(secs), 2), "max": round(max(secs), 2),
                          "runs": len(secs)}))
        print(json.dumps({"figure": "report_bytes_24h", "value": sizes[-1], "min": min(sizes),
                          "max": max(sizes), "runs": len(sizes)}))


if __name__ == "__main__":
    main()
