"""What does instrumenting one step cost? A trivial loop, bare and under :class:`Monitor`.

The loop does no work (a list of small tuples, nothing computed), so whatever the instrumented
loop takes beyond the bare one is the instrumentation itself: ``Monitor.loader`` timing the data
wait, ``Monitor.copy`` and ``Monitor.compute`` timing the step's parts, and the store writer
thread, which shares the interpreter lock with the loop, taking each step into ``run.db``. The
clock stops after ``Monitor.close()`` has committed the last step, so work the writer deferred is
counted too. The background samplers are off: they cost per second, not per step (see
``bench/overhead.py`` for their share).

Usage:
    .venv/bin/python bench/step_cost.py [--steps 200000] [--runs 5]

Three figures per run: wall time (what the loop waits), the process's CPU time (the loop's
thread plus the writer thread) and, of that, the loop's own thread (what the training thread
pays; the writer's share runs beside it on another core when one is free). The headline is the
process's CPU time per step: on a shared machine the wall time also measures the neighbours'
load, the CPU time only what this process spent. The last line is the headline as one JSON
object: microseconds of CPU per step (median of runs, with min and max), the loop thread's
median and the wall-clock median beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from stepscope.observe.monitor import Monitor


def _bare(data: list[tuple[int, int]]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    for _x, _y in data:
        pass
    return time.perf_counter() - w0, time.process_time() - c0


def _instrumented(data: list[tuple[int, int]], run_dir: Path) -> tuple[float, float, float]:
    mon = Monitor(run_dir, sample=False, command="bench/step_cost.py")
    mon.start()
    w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
    for _x, _y in mon.loader(data, phase="train", epoch=1, workers=0):
        with mon.copy():
            pass
        with mon.compute():
            pass
    loop_cpu = time.thread_time() - t0
    mon.close()
    return time.perf_counter() - w0, time.process_time() - c0, loop_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    data = [(i, i & 1) for i in range(args.steps)]
    cpu: list[float] = []
    wall: list[float] = []
    loop: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stepscope-step-cost-") as tmp:
        for i in range(args.runs):
            bare_w, bare_c = _bare(data)
            run_dir = Path(tmp) / f"run{i}"
            inst_w, inst_c, inst_loop = _instrumented(data, run_dir)
            wall.append((inst_w - bare_w) / args.steps * 1e6)
            cpu.append((inst_c - bare_c) / args.steps * 1e6)
            loop.append((inst_loop - bare_c) / args.steps * 1e6)
            db_bytes = sum(p.stat().st_size for p in run_dir.iterdir() if p.is_file())
            print(f"run {i + 1}: {cpu[-1]:.2f} us CPU/step ({loop[-1]:.2f} on the loop's "
                  f"thread), {wall[-1]:.2f} us wall/step "
                  f"(instrumented {inst_w:.2f} s wall, bare {bare_w:.3f} s), "
                  f"run.db {db_bytes / args.steps:.1f} bytes/step")
    print(json.dumps({"figure": "step_cost_cpu_us", "value": round(statistics.median(cpu), 2),
                      "min": round(min(cpu), 2), "max": round(max(cpu), 2),
                      "loop_thread_us": round(statistics.median(loop), 2),
                      "wall_us": round(statistics.median(wall), 2), "runs": len(cpu),
                      "steps": args.steps}))


if __name__ == "__main__":
    main()
