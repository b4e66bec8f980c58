"""Does the mixed_bfloat16 advice pay where stepscope gives it? A rerun against the baseline.

Runs ``tests/watch_scripts/keras_known.py`` (Keras 3, instant tf.data batches, on TensorFlow
or ``--backend jax|torch``)
under ``stepscope watch`` with a compute-bound model, checks that its finding advises
``keras.mixed_precision.set_global_policy("mixed_bfloat16")`` (it does only on a CPU with native
bf16: AVX512-BF16 or AMX), reruns the script with that policy, and compares training throughput
(images a second over the epochs after the first, which traces). Baseline and rerun alternate
so machine noise hits both alike. Two models: ``conv`` (three 3×3 convolutions, the known-answer
test's) and ``dense`` (a tiny Dense net, where the step is Keras's own overhead, not math): the
advice has no predicted figure under Keras, so the bench says what it buys for each.

Usage:
    PYTHONPATH=$PWD/src .venv/bin/python bench/keras_bf16.py [--pairs 3] [--steps 48]
        [--models conv dense] [--backend tensorflow|jax|torch]

The last line is one JSON object: the achieved speed-up per model (median over pairs, range).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from keras_spe_gain import advised_pairs, watch_known

ADVICE = 'set_global_policy("mixed_bfloat16")'


def _watch(out: Path, backend: str, model: str, steps: int, policy: str | None) -> dict:
    return watch_known(out, backend, "tfdata", "0", model, "--steps", str(steps),
                       "--epochs", "3", *(["--policy", policy] if policy else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--models", nargs="+", default=["conv", "dense"])
    ap.add_argument("--backend", choices=("tensorflow", "jax", "torch"), default="tensorflow")
    args = ap.parse_args()
    out: dict[str, object] = {"bench": "keras_bf16", "backend": args.backend, "pairs": args.pairs}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            out[model] = advised_pairs(
                args.pairs,
                lambda i, m=model: _watch(Path(tmp) / f"{m}-base{i}", args.backend, m,
                                          args.steps, None),
                lambda i, m=model: _watch(Path(tmp) / f"{m}-bf16{i}", args.backend, m,
                                          args.steps, "mixed_bfloat16"),
                ADVICE, (f"{model} ", "fp32", "mixed_bfloat16", "mixed_bfloat16"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
