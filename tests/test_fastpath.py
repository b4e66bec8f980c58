"""The trainer's fast paths end to end: bf16 autocast + channels_last, and --aug-backend gpu."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from stepscope.store.db import RunReader
from stepscope.train import setup
from stepscope.train.config import resolve_config
from stepscope.train.gpuaug import GpuAugment
from stepscope.train.loop import train
from tests.conftest import data_flags

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane

# One trunk thread: on a shared 2-core machine two OpenMP threads plus a loader worker
# oversubscribe the cores, and OpenMP's spin-waits then make every layer wait for a time slice
# (measured here: 86 s instead of 6.6 s for the same run).
THREADS = 1


def _val_accuracy(run: Path) -> float:
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    return float(rows[-1]["val_accuracy"])


@pytest.mark.slow
def test_bf16_reaches_the_fp32_val_accuracy(synth400: Path, tmp_path: Path) -> None:
    # No augmentation: epoch 2 trains the head on cached features, so each run costs one
    # trunk pass over the data, and the comparison is about the features bf16 computes.
    flags = {**data_flags(synth400), "img_size": 96, "epochs": 2, "augment": "none",
             "channels_last": True, "threads": THREADS}
    acc = {p: _val_accuracy(train(resolve_config(
        {**flags, "precision": p, "out": str(tmp_path / p)})).run_dir) for p in ("fp32", "bf16")}
    print(f"val_accuracy after 2 epochs: {acc}")
    assert acc["fp32"] > 0.7  # it learned something, so agreeing means something
    assert abs(acc["fp32"] - acc["bf16"]) <= 0.05


def test_setup_for_the_gpu_backend_decodes_only_on_the_cpu(synth80: Path) -> None:
    cfg = resolve_config({**data_flags(synth80), "img_size": 64, "weights": "none",
                          "aug_backend": "gpu", "device": "cpu"})
    s = setup.build(cfg)
    assert isinstance(s.gpu_aug, GpuAugment)
    assert s.train_loader.dataset.transform.augment is None  # type: ignore[attr-defined]
    assert s.device_prefetch is False  # CPU: nothing to overlap
    none = setup.build(resolve_config({**data_flags(synth80), "img_size": 64, "weights": "none",
                                       "aug_backend": "gpu", "augment": "none"}))
    assert none.gpu_aug is None


def test_a_run_with_the_gpu_backend_trains_and_is_recorded(synth80: Path, tmp_path: Path) -> None:
    run = train(resolve_config({**data_flags(synth80), "img_size": 64, "epochs": 1,
                                "weights": "none", "aug_backend": "gpu",
                                "threads": THREADS, "out": str(tmp_path / "run")})).run_dir
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert math.isfinite(float(rows[0]["train_loss"]))
    phases = RunReader(run).phases()
    assert [(p.epoch, p.phase) for p in phases] == [(1, "train"), (1, "val")]
    assert phases[0].images == 64
