"""Checkpoint writes in a watched Keras script: ModelCheckpoint's saves are timed (each one a
``trainer/checkpoint_write_s`` sample, as ``stepscope train`` records its own), given to the
epoch's phases, and advised on in Keras's words, leaving out what the ModelCheckpoint already
does. Real Keras 3 on TensorFlow, a real ~250 MB file written every epoch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PY = sys.executable
SRC = Path(__file__).resolve().parents[1] / "src"
SCRIPT = Path(__file__).parent / "watch_scripts" / "keras_checkpoint.py"


def _watch(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [PY, "-m", "stepscope", "watch", "--out", str(run), "--interval", "0.2", "--", PY,
         str(SCRIPT), str(out), *args], env=dict(os.environ, PYTHONPATH=str(SRC)),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((run / "summary.json").read_text()), proc.stdout


@pytest.mark.slow
def test_model_checkpoint_saves_are_timed_and_advised_on(tmp_path: Path) -> None:
    s, printed = _watch(tmp_path, "--epochs", "3")
    truth = {int(e): float(v) for e, v in re.findall(r"SAVE epoch=(\d+) seconds=([\d.]+)", printed)}
    assert sorted(truth) == [1, 2, 3]
    ck = s["checkpoints"]
    assert ck["writes"] == 3, ck
    assert ck["keras"] == {"save_best_only": False, "save_weights_only": False}
    # each epoch's write lands in its validation phase (it follows validation), timed as the
    # script's own clock around the ModelCheckpoint timed it
    val = {p["epoch"]: p["checkpoint_write_s"] for p in s["phases"] if p["phase"] == "val"}
    for epoch, seconds in truth.items():
        assert val[epoch] == pytest.approx(seconds, rel=0.3, abs=0.02), (epoch, val, truth)
    assert "Checkpoints were written 3 times" in printed
    f = next(f for f in s["findings"] if f["id"] == "checkpoint_time")
    assert "save_best_only=True" in f["fix"] and "save_weights_only=True" in f["fix"]
    assert "trainable part" not in f["fix"]  # the PyTorch trainer's words


@pytest.mark.slow
def test_a_best_only_checkpoint_is_not_told_to_save_best_only(tmp_path: Path) -> None:
    s, _ = _watch(tmp_path, "--epochs", "3", "--best-only")
    ck = s["checkpoints"]
    assert 1 <= ck["writes"] <= 3 and ck["keras"]["save_best_only"] is True, ck
    for f in s["findings"]:
        assert "save_best_only" not in f["fix"], f
