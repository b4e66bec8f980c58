"""The trainer's progress line, the one users watch: exact text on a non-terminal console."""

from __future__ import annotations

import io
from dataclasses import dataclass

from rich.console import Console

from stepscope.render.progress import TrainProgress, live_text


@dataclass
class Live:  # the monitor's LiveStats attributes the line reads
    images_per_s: float | None = None
    data_wait_frac: float | None = None
    cpu_util_pct: float | None = None
    gpu_util_pct: float | None = None
    disk_read_bytes_per_s: float | None = None


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False,
                   _environ={})


def test_live_text_says_what_is_known_and_marks_what_is_not() -> None:
    full = Live(23.5, 0.62, 98.0, 30.0, 1.2e6)
    assert live_text(full) == "wait 62 % cpu 98 % gpu 30 % disk 1.2 MB/s"
    assert live_text(Live()) == "wait — cpu — gpu — disk —"


def test_a_pipe_gets_one_line_per_phase_and_one_per_epoch() -> None:
    console = _console()
    p = TrainProgress(console)
    p.phase_start(0, 3, "train", steps=10)  # the loop counts epochs from 0 here
    p.step(4, 0.69314, 0.5, Live(8.0, 0.25, 150.0, None, 0.0))
    p.step(10, 0.5, 0.75, Live(8.46, 0.2, 140.0, None, 2e6))
    p.phase_end()
    p.epoch_end({"epoch": 1, "seconds": 12.34, "train_loss": 0.5, "train_accuracy": 0.75,
                 "val_loss": 0.4, "val_accuracy": 0.8})
    p.message("skipped 1 unreadable image(s)")
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == [
        "Epoch 1/3 train 10 steps  8.5 img/s  loss 0.5000  acc 0.750  "
        "wait 20 % cpu 140 % gpu — disk 2.0 MB/s",
        "epoch 1 - 12.3s - loss 0.5000 - accuracy 0.7500 - val_loss 0.4000 - "
        "val_accuracy 0.8000",
        "skipped 1 unreadable image(s)",
    ]


def test_no_step_no_phase_line() -> None:
    console = _console()
    p = TrainProgress(console)
    p.phase_start(0, 1, "val", steps=5)
    p.phase_end()
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]
