"""The reference trainer end to end, on real synthetic JPEGs with the real pretrained weights."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from stepscope.errors import StepscopeError
from stepscope.store.db import RunReader
from stepscope.train.config import resolve_config
from stepscope.train.loop import train
from tests.conftest import data_flags

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


@pytest.mark.slow
def test_three_epochs_reach_090_val_accuracy(synth400: Path, tmp_path: Path) -> None:
    cfg = resolve_config({**data_flags(synth400), "img_size": 224, "epochs": 3,
                          "augment": "seed", "out": str(tmp_path / "run")})
    result = train(cfg)
    assert result.status == "completed"
    rows = list(csv.DictReader((result.run_dir / "metrics.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    best = max(float(r["val_accuracy"]) for r in rows)
    print(f"val_accuracy per epoch: {[r['val_accuracy'] for r in rows]}, "
          f"seconds: {[r['seconds'] for r in rows]}")
    assert best >= 0.9
    assert (result.run_dir / "checkpoints" / "best.pt").is_file()
    assert (result.run_dir / "config.yaml").is_file()
    reader = RunReader(result.run_dir)
    assert reader.run().status == "completed"
    steps = reader.steps()
    assert steps, "every run is recorded by default"
    for s in steps:  # the step's parts add up to its wall time, on every step
        parts = s.data_wait_s + s.transfer_s + s.compute_s + s.other_s
        assert abs(parts - s.wall_s) <= 0.05 * s.wall_s


def test_checkpoint_and_resume(synth80: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = {**data_flags(synth80), "img_size": 64, "epochs": 1, "out": str(run),
             "weights": "none", "max_steps": 2, "augment": "none"}
    train(resolve_config(flags))
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert state["epoch"] == 0
    # Same epoch count: nothing to resume is an error that says what to do.
    with pytest.raises(StepscopeError, match="nothing to resume"):
        train(resolve_config({**flags, "resume": str(run)}))
    res = train(resolve_config({**flags, "epochs": 2, "resume": str(run), "out": None}))
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert res.rows[-1]["epoch"] == 2
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    phases = RunReader(run).phases()
    assert [(p.epoch, p.phase) for p in phases] == [(1, "train"), (1, "val"), (2, "train"), (2, "val")]


def test_refuses_to_overwrite_a_run(synth80: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = {**data_flags(synth80), "img_size": 64, "epochs": 1, "out": str(run),
             "weights": "none", "max_steps": 1, "augment": "none"}
    train(resolve_config(flags))
    with pytest.raises(StepscopeError, match="already holds a run"):
        train(resolve_config(flags))


def test_no_monitor_records_nothing(synth80: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(resolve_config({**data_flags(synth80), "img_size": 64, "epochs": 1, "out": str(run),
                          "weights": "none", "max_steps": 1, "monitor": False}))
    assert not (run / "run.db").exists()
    assert (run / "metrics.csv").is_file()


@pytest.mark.slow  # one small epoch (~9 s under load)
def test_a_jpeg_libjpeg_warns_about_is_named_not_printed_raw(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """libjpeg prints "Corrupt JPEG data: N extraneous bytes ..." to fd 2 from C; in training
    output that line named no file. The image decodes whole, so it is trained on and named."""
    from rich.console import Console

    from stepscope.render.progress import TrainProgress
    from stepscope.train.synth import synth_dataset
    from tests.test_data import extraneous_bytes_jpeg

    synth_dataset(tmp_path / "data", images=12, seed=3)
    name = next(csv.DictReader((tmp_path / "data" / "train.csv").open()))["Photo"]
    extraneous_bytes_jpeg(tmp_path / "data" / "images" / name)
    capfd.readouterr()
    res = train(resolve_config({**data_flags(tmp_path / "data"), "img_size": 64, "epochs": 1,
                                "out": str(tmp_path / "run"), "weights": "none",
                                "augment": "none", "batch_size": 4, "workers": "1"}),
                TrainProgress(Console(width=200)))  # what `stepscope train` prints
    out, err = capfd.readouterr()
    out = " ".join(out.split())  # rich wraps long lines
    assert res.status == "completed"
    assert "Corrupt JPEG data" not in err
    assert "kept 1 image(s) the JPEG decoder warned about" in out and name in out
    assert "extraneous bytes before marker" in out  # libjpeg's words, now with the file's name
