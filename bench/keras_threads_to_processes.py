"""Is the gain stepscope predicts for ``use_multiprocessing=True`` the gain a rerun gets?

Runs ``tests/watch_scripts/keras_known.py`` (Keras 3 on ``--backend``, TensorFlow unless told;
a tiny Dense model; a ``PyDataset(workers=2)`` on threads whose ``__getitem__`` is ``--load-ms``
of pure-Python CPU a batch, the GIL held throughout) under ``stepscope watch``, reads the
predicted speed-up of the fix it advises (``use_multiprocessing=True`` at the same worker count)
from the findings, reruns the script with worker processes under watch, and compares training
throughput (images / second over the epochs after the first, which starts the pool and traces
the train function). Pairs run one after the other, so machine noise hits both alike.

Usage:
    PYTHONPATH=$PWD/src .venv/bin/python bench/keras_threads_to_processes.py [--pairs 3]
        [--steps 48] [--load-ms 80] [--backend tensorflow|jax|torch]

The last line is one JSON object: predicted and achieved (median over pairs) speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keras_spe_gain import train_rate, watch_known


def _watch(out: Path, backend: str, steps: int, load_ms: float, processes: bool) -> dict:
    return watch_known(out, backend, "pydataset", str(load_ms), "dense", "--workers", "2",
                       "--cpu-clock", "--steps", str(steps), "--epochs", "3",
                       *(["--mp"] if processes else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--load-ms", type=float, default=80.0)
    ap.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="tensorflow")
    args = ap.parse_args()
    predicted: list[float] = []
    achieved: list[float] = []
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            base = _watch(Path(tmp) / f"threads{i}", args.backend, args.steps, args.load_ms, False)
            f = next((f for f in base["findings"] if "use_multiprocessing=True" in f["fix"]),
                     None)
            if f is None:
                print(f"pair {i + 1}: no use_multiprocessing fix advised "
                      f"({[x['id'] for x in base['findings']]})", flush=True)
                continue
            gain = float(re.search(r"predicted ([\d.]+)×", f["expected_gain"]).group(1))  # type: ignore[union-attr]
            procs = _watch(Path(tmp) / f"processes{i}", args.backend, args.steps, args.load_ms, True)
            ratio = train_rate(procs) / train_rate(base)
            predicted.append(gain)
            achieved.append(ratio)
            print(f"pair {i + 1}: threads {train_rate(base):.0f} img/s, processes "
                  f"{train_rate(procs):.0f} img/s; predicted {gain:.2f}×, achieved {ratio:.2f}× "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    if not achieved:
        sys.exit("no pair was advised use_multiprocessing=True")
    print(json.dumps({"bench": "keras_threads_to_processes", "backend": args.backend,
                      "predicted_x": round(statistics.median(predicted), 2),
                      "achieved_x": round(statistics.median(achieved), 2),
                      "achieved_range_x": [round(min(achieved), 2), round(max(achieved), 2)],
                      "pairs": len(achieved), "load_start": round(load0, 1)}))


if __name__ == "__main__":
    main()
