"""Is the ``steps_per_execution`` gain stepscope predicts the gain a rerun gets?

Runs ``tests/watch_scripts/keras_known.py`` (Keras 3 on TensorFlow, a tiny Dense model, instant
PyDataset batches, a user callback sleeping ``--callback-ms`` in ``on_train_batch_end``: per-batch
logging to a slow sink) under ``stepscope watch``, reads the advised ``steps_per_execution=N``
and its predicted gain from the findings, reruns the script with ``steps_per_execution=N`` under
watch, and compares training throughput (images / second over the epochs after the first, which
traces the train function). Pairs alternate so machine noise hits both alike. The rerun uses 4×
as many batches per epoch so an epoch still lasts long enough to time (its per-epoch start-up
costs weigh more in it: the achieved figure errs low, if anything).

With ``--callback-ms 0`` there is no callback: Keras's own per-batch Python and the train
function's dispatch are the overhead (on a CPU watch times the graph inside the step, and the
rest is the step's *other*); ``--input arrays`` feeds NumPy arrays, as a ``fit(x, y)`` does.

Usage:
    PYTHONPATH=$PWD/src .venv/bin/python bench/keras_spe_gain.py [--pairs 3] [--steps 192]
        [--callback-ms 30] [--input pydataset|arrays]

The last line is one JSON object: predicted and achieved (median over pairs) speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "watch_scripts" / "keras_known.py"


def watch_known(out: Path, *args: str) -> dict:
    """``stepscope watch --out OUT -- python keras_known.py ARGS``; its summary."""
    cmd = [sys.executable, "-m", "stepscope", "watch", "--out", str(out), "--",
           sys.executable, str(SCRIPT), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900,
                   env=dict(os.environ))
    return json.loads((out / "summary.json").read_text())


def _watch(out: Path, steps: int, callback_ms: float, spe: int, source: str = "pydataset"
           ) -> dict:
    return watch_known(out, "tensorflow", source, "0", "dense", "--steps", str(steps),
                       "--epochs", "3", "--callback-ms", str(callback_ms), "--spe", str(spe))


def train_rate(summary: dict) -> float:
    """Training images a second over the epochs after the first (which traces)."""
    train = [p for p in summary["phases"] if p["phase"] == "train" and p["epoch"] >= 2]
    return sum(p["images"] for p in train) / sum(p["seconds"] for p in train)


def advised_pairs(pairs: int, base: Callable[[int], dict], fixed: Callable[[int], dict],
                  advice: str, words: tuple[str, str, str, str]) -> dict[str, object]:
    """A fix stepscope advises, rerun against its baseline ``pairs`` times, the two runs of a
    pair one after the other so machine noise hits both alike: ``base(i)`` and ``fixed(i)``
    run them. Returns whether every baseline's findings gave ``advice`` and the fix's training
    throughput over the baseline's (median, range). Each pair is printed as ``words`` name it:
    (the pair's prefix, the baseline, the advice, the fix)."""
    prefix, base_name, advice_name, fix_name = words
    ratios: list[float] = []
    advised: list[bool] = []
    for i in range(pairs):
        before = base(i)
        advised.append(advice in " ".join(f["fix"] for f in before["findings"]))
        after = fixed(i)
        ratios.append(train_rate(after) / train_rate(before))
        print(f"{prefix}pair {i + 1}: {base_name} {train_rate(before):.0f} img/s "
              f"({before['by_phase']['train']['verdict']}, {advice_name} "
              f"{'advised' if advised[-1] else 'not advised'}), {fix_name} "
              f"{train_rate(after):.0f} img/s: {ratios[-1]:.2f}×", flush=True)
    return {"advised": all(advised), "achieved_x": round(statistics.median(ratios), 2),
            "range_x": [round(min(ratios), 2), round(max(ratios), 2)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=192)
    ap.add_argument("--callback-ms", type=float, default=30.0)
    ap.add_argument("--input", choices=("pydataset", "arrays"), default="pydataset")
    args = ap.parse_args()
    predicted: list[float] = []
    achieved: list[float] = []
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            base = _watch(Path(tmp) / f"base{i}", args.steps, args.callback_ms, 1, args.input)
            f = next(f for f in base["findings"] if "steps_per_execution=" in f["fix"])
            n = int(re.search(r"steps_per_execution=(\d+)", f["fix"]).group(1))  # type: ignore[union-attr]
            gain = float(re.search(r"~([\d.]+)×", f["expected_gain"]).group(1))  # type: ignore[union-attr]
            fast = _watch(Path(tmp) / f"spe{i}", 4 * args.steps, args.callback_ms, n, args.input)
            ratio = train_rate(fast) / train_rate(base)
            predicted.append(gain)
            achieved.append(ratio)
            print(f"pair {i + 1}: baseline {train_rate(base):.0f} img/s (other "
                  f"{base['by_phase']['train']['other_frac']:.0%} of a step, "
                  f"{base['by_phase']['train']['verdict']}), "
                  f"steps_per_execution={n}: {train_rate(fast):.0f} img/s; predicted "
                  f"{f['expected_gain']!r}, achieved {ratio:.2f}×", flush=True)
    print(json.dumps({"bench": "keras_spe_gain", "steps_per_execution": n,
                      "predicted_x": statistics.median(predicted),
                      "achieved_x": round(statistics.median(achieved), 2),
                      "achieved_range_x": [round(min(achieved), 2), round(max(achieved), 2)],
                      "pairs": args.pairs, "input": args.input,
                      "callback_ms": args.callback_ms}))


if __name__ == "__main__":
    main()
