"""The trainer's Keras-like progress: a bar per epoch and phase, then a one-line epoch summary.

Besides img/s, ETA, loss and accuracy the bar shows what the monitor sees live: the share of
step time spent waiting for data, CPU and GPU utilisation and the physical disk read rate.
On a non-terminal (CI, a pipe) it prints one line per phase instead of redrawing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from stepscope.analysis.fmt import fmt_bytes_per_s, fmt_img_s, fmt_pct, fmt_pct_value
from stepscope.reports import EpochMetrics


def live_text(live: Any) -> str:
    """``wait 62 % cpu 98 % gpu — disk 1.2 MB/s`` from a LiveStats."""
    return (
        f"wait {fmt_pct(live.data_wait_frac)} cpu {fmt_pct_value(live.cpu_util_pct)} "
        f"gpu {fmt_pct_value(live.gpu_util_pct)} disk {fmt_bytes_per_s(live.disk_read_bytes_per_s)}"
    )


class TrainProgress:
    """Implements the trainer's Progress protocol with rich."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._label = ""
        self._last: tuple[int, float | None, float | None, Any] | None = None

    def phase_start(self, epoch: int, epochs: int, phase: str, steps: int) -> None:
        self._label = f"Epoch {epoch + 1}/{epochs} {phase:<5}"
        self._last = None
        if not self.console.is_terminal:
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            TextColumn("{task.completed}/{task.total}"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=self.console,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self._label, total=steps, stats="")

    def step(self, done: int, loss: float | None, accuracy: float | None, live: Any) -> None:
        self._last = (done, loss, accuracy, live)
        if self._progress is None or self._task is None:
            return
        self._progress.update(self._task, completed=done, stats=self._stats(loss, accuracy, live))

    @staticmethod
    def _stats(loss: float | None, accuracy: float | None, live: Any) -> str:
        ips = live.images_per_s
        parts = [
            "" if ips is None else fmt_img_s(ips),
            "" if loss is None else f"loss {loss:.4f}",
            "" if accuracy is None else f"acc {accuracy:.3f}",
            live_text(live),
        ]
        return "  ".join(p for p in parts if p)

    def phase_end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._last is not None:
            done, loss, acc, live = self._last
            self.console.print(f"{self._label} {done} steps  {self._stats(loss, acc, live)}",
                               highlight=False)

    def epoch_end(self, row: EpochMetrics) -> None:
        parts = [f"epoch {row['epoch']}", f"{row['seconds']:.1f}s",
                 f"loss {row['train_loss']:.4f}", f"accuracy {row['train_accuracy']:.4f}"]
        if row.get("val_loss") is not None:
            parts += [f"val_loss {row['val_loss']:.4f}", f"val_accuracy {row['val_accuracy']:.4f}"]
        self.console.print(" - ".join(parts), highlight=False)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)
