"""Predicted vs achieved speed-up of input fixes on the known-answer scenarios.

For each pair, the baseline scenario (``tests/watch_scripts/planted_input.py``) is recorded with
the Monitor API; the fix it is given is the one its capacity model prices (the worker count
its finding proposes, ``persistent_workers=True``) or a worker count it says cannot help; the
fixed run is recorded the same way; ``analysis.compare.predicted_gain`` puts the baseline's
prediction beside what the fixed run achieved (steady-state img/s for worker counts, whole
phases for persistent workers).

Usage: ``PYTHONPATH=src python bench/predicted_vs_achieved.py [--out DIR]``. One line per pair,
then the headline JSON: the median absolute error (target ≤ 25 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from stepscope.analysis.compare import PredictedGain, predicted_gain
from stepscope.analysis.summary import write_summary

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "watch_scripts" / "planted_input.py"
# (baseline scenario, how to choose the fix, the phase (epoch index from 1, kind) compared)
PAIRS: list[tuple[str, str, tuple[int, str]]] = [
    ("workers_latency", "proposed", (1, "train")),
    ("iterable", "proposed", (1, "train")),
    ("inline_spare_core", "proposed", (1, "train")),
    ("few_steps", "proposed", (1, "train")),
    ("cpu_saturated", "workers=4", (1, "train")),
    ("nonpersistent", "persistent=1", (2, "train")),
]


def _record(name: str, out: Path, *overrides: str) -> dict[str, Any]:
    subprocess.run([sys.executable, str(SCRIPT), name, "monitor", str(out), *overrides],
                   check=True, timeout=900)
    return write_summary(out)


def _phase(s: dict[str, Any], nth: int, kind: str) -> dict[str, Any]:
    epochs = sorted({p["epoch"] for p in s["phases"]})
    return next(p for p in s["phases"] if p["epoch"] == epochs[nth - 1] and p["phase"] == kind)


def _fix(base_phase: dict[str, Any], how: str) -> str | None:
    if how != "proposed":
        return how
    pred = next((p for p in base_phase.get("predictions") or [] if "workers" in p), None)
    return None if pred is None else f"workers={pred['workers']}"


def run_pair(name: str, how: str, where: tuple[int, str], folder: Path) -> PredictedGain | None:
    base = _record(name, folder / f"{name}-a")
    pa = _phase(base, *where)
    fix = _fix(pa, how)
    if fix is None:
        print(f"{name}: no fix proposed (cause {pa.get('input_cause')})")
        return None
    fixed = _record(name, folder / f"{name}-b", fix)
    gain = predicted_gain(pa, _phase(fixed, *where))
    if gain is None:
        print(f"{name}: {fix}: no prediction to compare")
        return None
    print(f"{name}: {gain.change}: predicted {gain.predicted:.2f}×, achieved "
          f"{gain.achieved:.2f}×, error {gain.error_frac:+.0%}")
    if gain.change == "persistent_workers=True":
        whole = _whole_run(base, fixed)
        if whole is not None:
            print(f"{name}: {gain.change}, the whole run (every epoch's train and validation "
                  f"phases): predicted {whole[0]:.2f}×, achieved {whole[1]:.2f}×, error "
                  f"{whole[0] / whole[1] - 1:+.0%}")
    return gain


def _whole_run(base: dict[str, Any], fixed: dict[str, Any]) -> tuple[float, float] | None:
    """Non-persistent workers start again in every phase: the run's predicted speed-up is its
    seconds over the sum of each phase's predicted seconds (a phase without a prediction, such
    as a loader's first, keeps its own)."""
    def predicted_s(p: dict[str, Any]) -> float:
        q = next((q for q in p.get("predictions") or []
                  if q.get("change") == "persistent_workers=True"), None)
        return float(p["seconds"]) / float(q["speedup"]) if q else float(p["seconds"])

    now = sum(float(p["seconds"]) for p in base["phases"])
    new = sum(predicted_s(p) for p in base["phases"])
    got = sum(float(p["seconds"]) for p in fixed["phases"])
    return None if not new or not got else (now / new, now / got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here")
    ap.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        gains = [g for name, how, where in PAIRS if not args.only or name in args.only
                 if (g := run_pair(name, how, where, folder)) is not None]
    errors = [abs(g.error_frac) for g in gains]
    within = sum(e <= 0.25 for e in errors)
    print(f"{within} of {len(errors)} predictions within ±25 % of what was achieved")
    print(json.dumps({"figure": "input_fix_prediction_abs_error",
                      "value": round(statistics.median(errors), 3) if errors else None,
                      "min": round(min(errors), 3) if errors else None,
                      "max": round(max(errors), 3) if errors else None, "runs": len(errors)}))


if __name__ == "__main__":
    main()
