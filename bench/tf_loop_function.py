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
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keras_spe_gain import advised_pairs

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
    with tempfile.TemporaryDirectory() as tmp:
        found = advised_pairs(
            args.pairs, lambda i: _watch(Path(tmp) / f"eager{i}", args.steps, True),
            lambda i: _watch(Path(tmp) / f"graph{i}", args.steps, False),
            "@tf.function", ("", "eager", "@tf.function", "tf.function"))
    print(json.dumps({"bench": "tf_loop_function", "pairs": args.pairs, **found}))


if __name__ == "__main__":
    main()
