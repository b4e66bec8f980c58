"""Checkpoint writes in a watched script, which run between steps and phases: each is timed (a
``trainer/checkpoint_write_s`` sample, as ``stepscope train`` records its own), given to the
phase it follows, and advised on in the framework's words. Keras: ModelCheckpoint's saves
(Keras 3 on TensorFlow), the advice leaving out what the ModelCheckpoint already does. PyTorch:
the tutorials' ``torch.save`` after each epoch's training. Real files of ~200-250 MB, each
script timing its own saves: the truth."""

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
SCRIPTS = Path(__file__).parent / "watch_scripts"
SCRIPT = SCRIPTS / "keras_checkpoint.py"


def _watch(tmp_path: Path, *args: str, script: Path = SCRIPT) -> tuple[dict[str, Any], str]:
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [PY, "-m", "stepscope", "watch", "--out", str(run), "--interval", "0.2", "--", PY,
         str(script), str(out), *args], env=dict(os.environ, PYTHONPATH=str(SRC)),
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the explanation wraps at 80 columns: one space between words, as it reads
    return json.loads((run / "summary.json").read_text()), " ".join(proc.stdout.split())


def _truth(printed: str) -> dict[int, float]:
    """Each epoch's save as the script timed it (``SAVE epoch=E seconds=S``)."""
    return {int(e): float(v) for e, v in re.findall(r"SAVE epoch=(\d+) seconds=([\d.]+)", printed)}


@pytest.mark.slow
def test_model_checkpoint_saves_are_timed_and_advised_on(tmp_path: Path) -> None:
    s, printed = _watch(tmp_path, "--epochs", "3")
    truth = _truth(printed)
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
    # the run's budget names them among what ran between the phases
    assert re.search(r"between the phases and after the last, [\d.]+ s of it writing checkpoints",
                     printed), printed[-2000:]
    f = next(f for f in s["findings"] if f["id"] == "checkpoint_time")
    assert "save_best_only=True" in f["fix"] and "save_weights_only=True" in f["fix"]
    assert "trainable part" not in f["fix"]  # the PyTorch trainer's words


@pytest.mark.slow
def test_checkpoints_inside_the_steps_are_the_overhead_named(tmp_path: Path) -> None:
    """ModelCheckpoint(save_freq=2): a ~250 MB write every second batch, inside the epoch, on
    the loop's thread. Training is overhead-bound because of the writes: the fix writes less
    often, not steps_per_execution (which the callbacks' time alone would suggest)."""
    s, printed = _watch(tmp_path, "--epochs", "3", "--save-freq", "2")
    agg = s["by_phase"]["train"]
    assert agg["verdict"] == "overhead-bound", agg
    assert agg["checkpoint_in_phase_s"] >= 0.5 * agg["other_frac"] * agg["seconds"], agg
    f = next(f for f in s["findings"] if f["id"] == "overhead_bound_train")
    assert 'save_freq="epoch"' in f["fix"] and "steps_per_execution" not in f["fix"], f
    assert "Most of it was checkpoints written inside the steps" in printed
    assert "end of each epoch the busiest part" not in printed


@pytest.mark.slow
def test_a_best_only_checkpoint_is_not_told_to_save_best_only(tmp_path: Path) -> None:
    s, _ = _watch(tmp_path, "--epochs", "3", "--best-only")
    ck = s["checkpoints"]
    assert 1 <= ck["writes"] <= 3 and ck["keras"]["save_best_only"] is True, ck
    for f in s["findings"]:
        assert "save_best_only" not in f["fix"], f


@pytest.mark.slow
def test_torch_save_between_training_and_validation_is_timed(tmp_path: Path) -> None:
    s, printed = _watch(tmp_path, "--epochs", "2", script=SCRIPTS / "torch_checkpoint.py")
    truth = _truth(printed)
    assert sorted(truth) == [1, 2]
    assert s["checkpoints"]["writes"] == 2 and s["checkpoints"]["keras"] is None
    # saved after each epoch's last training step, before validation: the train phase's
    train = {p["epoch"]: p["checkpoint_write_s"] for p in s["phases"] if p["phase"] == "train"}
    for epoch, seconds in truth.items():
        assert train[epoch] == pytest.approx(seconds, rel=0.3, abs=0.02), (epoch, train, truth)
    assert "Checkpoints were written 2 times" in printed
    f = next(f for f in s["findings"] if f["id"] == "checkpoint_time")
    assert "ModelCheckpoint" not in f["fix"] and "trainable part" in f["fix"]


@pytest.mark.slow
def test_lightning_model_checkpoint_writes_are_timed_whole(tmp_path: Path) -> None:
    """Lightning serialises with torch.save into memory, then writes the file: each write is
    timed once (at Trainer.save_checkpoint, the inner torch.save inside it), one a file."""
    s, _ = _watch(tmp_path, "--epochs", "2", script=SCRIPTS / "lightning_checkpoint.py")
    written = sorted(p.name for p in (tmp_path / "out").glob("*.ckpt"))
    assert written == ["epoch=0.ckpt", "epoch=1.ckpt"]
    ck = s["checkpoints"]
    assert ck["writes"] == 2 and ck["total_s"] > 0, ck
    assert ck["total_s"] < s["run"]["seconds"], ck
    # the writes are ModelCheckpoint's: where they matter, its arguments are the fix
    assert s["loader"]["framework"] == "lightning"
    from stepscope.analysis.vocab import LIGHTNING, vocab

    assert "ModelCheckpoint(every_n_epochs=N)" in vocab(LIGHTNING).checkpoint_fix
    found = [f for f in s["findings"] if f["id"] == "checkpoint_time"]
    assert found and all("ModelCheckpoint(" in f["fix"] for f in found), s["findings"]
    # its model is two Linear layers: no image batch, so no channels_last to offer
    fix = next(f["fix"] for f in s["findings"] if f["id"] == "compute_bound_train")
    assert "channels_last" not in fix and fix.startswith('Trainer(precision="bf16-mixed")'), fix


@pytest.mark.slow
def test_hf_trainer_checkpoints_are_timed_whole_without_its_callback(tmp_path: Path) -> None:
    """A Trainer watched with no stepscope code: each checkpoint (the model's safetensors, the
    optimizer's, scheduler's and RNG states' torch.save) is one write, timed as the script's own
    clock around ``Trainer._save_checkpoint`` timed it. Before, the safetensors write went
    untimed and each small torch.save counted as a checkpoint of its own. And its advice names
    TrainingArguments, through which the Trainer builds its DataLoaders."""
    s, printed = _watch(tmp_path, "--epochs", "2",
                        script=SCRIPTS / "hf_trainer_checkpoint.py")
    truth = _truth(printed)
    assert sorted(truth) == [1, 2], printed[-2000:]
    ck = s["checkpoints"]
    assert ck["writes"] == 2, ck
    assert ck["total_s"] == pytest.approx(sum(truth.values()), rel=0.3, abs=0.03), (ck, truth)
    assert s["by_phase"]["train"]["verdict"] == "input-bound"
    assert s["loader"]["framework"] == "transformers"
    fix = next(f["fix"] for f in s["findings"] if f["id"] == "input_bound_train")
    assert "TrainingArguments(dataloader_num_workers=" in fix and "DataLoader(" not in fix, fix
    assert "too few DataLoader workers (TrainingArguments' dataloader_num_workers)" in printed
