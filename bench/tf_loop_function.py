"""What ``@tf.function`` buys a TensorFlow loop written from scratch that runs its step eagerly:
the fix stepscope gives such a loop, rerun against the eager baseline.

Runs ``tests/watch_scripts/tf_loop.py`` (the Keras guide's GradientTape loop over an in-memory
``tf.data`` dataset, three convolutions) under ``stepscope watch`` with ``--eager``, checks that a
finding advises ``@tf.function``, reruns it as the guide's second version (the train and test
steps in ``tf.function``), and compares training throughput (images a second over the epochs
after the first, which traces). Baseline and rerun alternate so machine noise hits both alike.

Usage:
    PYTHONPATH=$PWD/src .venv/bin/python bench/tf_loop_function.py [--pairs 3] [--steps 48]

The last line is one JSON object: the achieved speed-up (median over pairs, range).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keras_spe_gain import train_rate

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "watch_scripts" / "tf_loop.py"


def _watch(out: Path, steps: int, eager: bool) -> dict:
    cmd = [sys.executable, "-m", "stepscope", "watch", "--out", str(out), "--",
           sys.executable, str(SCRIPT), "0", "conv", "--steps", str(steps), "--val", "4",
           "--epochs", "3", *(["--eager"] if eager else [])]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900,
                   env=dict(os.environ))
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    ratios: list[float] = []
    advised: list[bool] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            eager = _watch(Path(tmp) / f"eager{i}", args.steps, True)
            advised.append(any("@tf.function" in f["fix"] for f in eager["findings"]))
            graph = _watch(Path(tmp) / f"graph{i}", args.steps, False)
            ratio = train_rate(graph) / train_rate(eager)
            ratios.append(ratio)
            print(f"pair {i + 1}: eager {train_rate(eager):.0f} img/s "
                  f"({eager['by_phase']['train']['verdict']}, @tf.function "
                  f"{'advised' if advised[-1] else 'not advised'}), tf.function "
                  f"{train_rate(graph):.0f} img/s: {ratio:.2f}×", flush=True)
    print(json.dumps({"bench": "tf_loop_function", "pairs": args.pairs, "advised": all(advised),
                      "achieved_x": round(statistics.median(ratios), 2),
                      "range_x": [round(min(ratios), 2), round(max(ratios), 2)]}))


if __name__ == "__main__":
    main()
