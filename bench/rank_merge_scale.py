"""What the per-rank stores and their merge cost as a job grows: 64, 512, 4,096 ranks.

Synthetic rank stores, written through the real store (``RunWriter``, the same schema and
indexes a watched or trained rank gets), shaped like a data-parallel rank: a main process with
DataLoader workers sampled once a second (the process-tree series a rank store holds), one step
record and one all-reduce arrival per step. One rank, two ranks' worth of nothing else: the
host-wide series live once in ``run.db``.

Two figures:

1. bytes per rank per hour: one rank store holding a full hour (``--hour-step-s`` per step,
   samples at 1 Hz), its size on disk after the writer closed (database + WAL);
2. merge time: the report's rank merge (``add_rank_stores``: the detailed merge up to
   ``ROLLUP_ABOVE_RANKS`` ranks, per-rank roll-ups above) over N stores of ``--steps`` steps,
   with one planted straggler (rank N // 3 arrives ``--late-ms`` late at every all-reduce),
   which the merge must name.

Usage:
    python bench/rank_merge_scale.py                       # 64, 512, 4096 ranks
    python bench/rank_merge_scale.py --ranks 64,512 --steps 100

Last line: ``{"figure": "rank_merge_s_4096", "value": ..., ...}`` with every size's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from stepscope.analysis.ranks import add_rank_stores
from stepscope.analysis.rankscale import ROLLUP_ABOVE_RANKS
from stepscope.store.db import RunWriter
from stepscope.store.records import (
    ArrivalRecord,
    PhaseRecord,
    ProcessInfo,
    RunInfo,
    Sample,
    StepRecord,
)
from stepscope.store.rundir import RunDir, rank_db_name

T0 = 1_800_000_000.0
PROC_METRICS = ("cpu_util_pct", "rss_bytes", "read_bytes", "rchar_bytes", "threads", "running",
                "disk_wait")
TREE_METRICS = ("cpu_util_pct", "rss_bytes", "read_bytes", "rchar_bytes", "read_rate_bytes_per_s",
                "cache_read_rate_bytes_per_s", "workers")


def write_rank(run_dir: Path, rank: int, world: int, steps: int, step_s: float, workers: int,
               late_s: float) -> Path:
    """One rank's store: processes, one train phase, steps, arrivals, 1 Hz tree samples."""
    pid = 10_000 + rank
    w = RunWriter(run_dir, RunInfo(name="scale", command="bench", kind="watch", rank=rank,
                                   world_size=world, started=T0, pid=pid),
                  db_name=rank_db_name(rank), clock=lambda: T0 + steps * step_s,
                  commit_every_s=30.0)
    pids = [pid] + [pid * 100 + i for i in range(workers)]
    for i, p in enumerate(pids):
        w.put_process(ProcessInfo(p, pid if i else 1, "worker" if i else "main",
                                  "pt_data_worker" if i else "python", T0, T0 + steps * step_s))
    w.fact("dist.host", f"node{rank // 8}", "bench: 8 ranks per node")
    w.fact("dist.node_rank", rank // 8, "bench")
    w.fact("dist.pid", pid, "bench")
    w.fact("dist.status", "completed", "bench")
    w.fact("dist.exit_code", 0, "bench")
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=T0,
                            ended=T0 + steps * step_s, steps=steps, images=32 * steps,
                            workers=workers, rank=rank))
    compute = 0.6 * step_s + late_s
    for n in range(steps):
        t = T0 + n * step_s
        w.add_step(StepRecord(phase_id=0, step=n, t_start=t, wall_s=step_s + late_s,
                              data_wait_s=0.05 * step_s, transfer_s=0.0, compute_s=compute,
                              comm_s=0.3 * step_s, other_s=0.05 * step_s, images=32,
                              warmup=n < 3))
        arrive = t + 0.65 * step_s + late_s + (rank % 7) * 1e-4
        w.add_arrival(ArrivalRecord(seq=n, t_arrive=arrive, wait_s=0.3 * step_s - late_s
                                    if late_s < 0.3 * step_s else 0.001, comm_s=0.3 * step_s))
    for sec in range(int(steps * step_s) + 1):
        t = T0 + sec
        batch = [Sample(t, "tree", m, 1.0) for m in TREE_METRICS]
        batch += [Sample(t, f"proc:{p}", m, 1.0) for p in pids for m in PROC_METRICS]
        w.add_samples(batch)
    w.close("completed", 0)
    return run_dir / rank_db_name(rank)


def store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def bytes_per_rank_hour(step_s: float, workers: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        steps = int(3600 / step_s)
        path = write_rank(Path(tmp), 1, 2, steps, step_s, workers, 0.0)
        return store_bytes(path)


def merge_once(n: int, steps: int, step_s: float, workers: int, late_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        t0 = time.perf_counter()
        slow = n // 3
        for k in range(n):
            write_rank(run_dir, k, n, steps, step_s, workers, late_s if k == slow else 0.0)
        build_s = time.perf_counter() - t0
        disk = sum(store_bytes(RunDir(run_dir).rank_db(k)) for k in range(n))
        summary: dict[str, object] = {"findings": []}
        t1 = time.perf_counter()
        add_rank_stores(summary, run_dir)
        merge_s = time.perf_counter() - t1
        rows = summary["ranks"]
        assert isinstance(rows, list)
        named = [r["rank"] for r in rows if r["straggler"]]
        return {"ranks": n, "merge_s": merge_s, "write_s": build_s,
                "mode": "rollup" if n > ROLLUP_ABOVE_RANKS else "detailed",
                "store_bytes_per_rank": disk / n, "straggler_named": named == [slow]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,512,4096")
    ap.add_argument("--steps", type=int, default=200, help="steps per rank store in the merge")
    ap.add_argument("--step-s", type=float, default=0.1, help="seconds per step")
    ap.add_argument("--hour-step-s", type=float, default=0.1,
                    help="seconds per step of the one-hour store")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    ap.add_argument("--late-ms", type=float, default=30.0)
    args = ap.parse_args()
    per_hour = bytes_per_rank_hour(args.hour_step_s, args.workers)
    print(f"one rank-hour ({3600 / args.hour_step_s:.0f} steps and all-reduces, "
          f"{args.workers} workers, 1 Hz samples): {per_hour / 1e6:.1f} MB", file=sys.stderr)
    results = []
    for n in (int(x) for x in args.ranks.split(",")):
        r = merge_once(n, args.steps, args.step_s, args.workers, args.late_ms / 1000.0)
        results.append(r)
        print(f"{n} ranks ({r['mode']}): merge {r['merge_s']:.2f} s, stores written in "
              f"{r['write_s']:.1f} s, {r['store_bytes_per_rank'] / 1e3:.0f} kB per rank store "
              f"of {args.steps} steps; planted straggler named: {r['straggler_named']}",
              file=sys.stderr, flush=True)
    last = results[-1]
    print(json.dumps({"figure": f"rank_merge_s_{last['ranks']}",
                      "value": round(last["merge_s"], 3), "runs": 1,
                      "bytes_per_rank_hour": per_hour,
                      "steps_per_rank": args.steps,
                      "by_ranks": [{k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in r.items()} for r in results]}))


if __name__ == "__main__":
    main()
