"""Cost of each loader stage hook (observe/stages.py): nanoseconds added per hooked call.

For each hook kind the same trivial call runs bare and hooked, many times, in this process
with the counters on (``STEPSCOPE_STAGES_DIR`` set, as during a recorded run); the figure is the
median over runs of (hooked − bare) per call. Hooks:

- ``stage``      a ``Stage`` enter/exit: what each PIL/cv2/torchvision/Compose/collate/pin hook
  adds per call (``timed`` wrapper included);
- ``batch``      a ``BatchTimer`` around one DataLoader fetch (two reads of
  ``/proc/thread-self/schedstat``): added once per batch;
- ``wait``       the training loop's per-step reading of its thread's CPU time (``thread_time``
  twice) and the probe's bookkeeping;
- ``unset``      a hooked call with ``STEPSCOPE_STAGES_DIR`` unset (hooks installed, nothing
  recording).

Usage: ``PYTHONPATH=src python bench/stage_hooks.py [--calls 200000] [--runs 5]``. The last line
is the headline JSON (the ``stage`` hook's cost per call, in µs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from stepscope.observe import stages


def _bare(x: int) -> int:
    return x + 1


def _per_call_ns(fn: Callable[[int], int], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(calls):
        fn(i)
    return (time.perf_counter_ns() - t0) / calls


def _batch(x: int) -> int:
    with stages.BatchTimer(8):
        return x + 1


def _probe(probe: stages.LoaderProbe) -> Callable[[int], int]:
    thread_time = time.thread_time

    def step(x: int) -> int:
        c0 = thread_time()
        y = x + 1
        probe.waited(1e-5, thread_time() - c0)
        return y

    return step


def measure(calls: int, runs: int) -> dict[str, list[float]]:
    hooked = stages.timed("decode", _bare)
    out: dict[str, list[float]] = {"stage": [], "batch": [], "wait": [], "unset": [], "bare": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(runs):
            stages.set_folder(folder)
            bare = _per_call_ns(_bare, calls)
            out["bare"].append(bare)  # the machine's speed: a plain Python call, for scale
            out["stage"].append(_per_call_ns(hooked, calls) - bare)
            out["batch"].append(_per_call_ns(_batch, calls // 10) - bare)
            out["wait"].append(_per_call_ns(_probe(stages.LoaderProbe(None, os.getpid())),
                                            calls) - bare)
            stages.set_folder(None)
            out["unset"].append(_per_call_ns(hooked, calls) - bare)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    found = measure(args.calls, args.runs)
    for name, values in found.items():
        print(f"{name:6s} +{statistics.median(values) / 1000:.2f} µs per call "
              f"(min {min(values) / 1000:.2f}, max {max(values) / 1000:.2f}, {len(values)} runs)")
    v = [x / 1000 for x in found["stage"]]
    print(json.dumps({"figure": "stage_hook_us_per_call", "value": round(statistics.median(v), 3),
                      "min": round(min(v), 3), "max": round(max(v), 3), "runs": len(v)}))


if __name__ == "__main__":
    main()
