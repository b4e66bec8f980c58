"""What the framework callbacks (``stepscope.keras``/``lightning``/``hf``) share: start a
recording when training starts, and at its end close it and write the summary and report, as
``watch`` does. Each framework module only maps its loop's hooks onto the recorder.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepscope.finish import FinishedRun, finish_run
from stepscope.observe.callbacks import CallbackRecording, recording_active

_CURRENT: list[RunOwner] = []  # the owner that started the recording active in this process


class RunOwner:
    """One run directory recorded from one framework's callbacks.

    Args:
        out: the run directory (``runs/mine``): ``run.db``, ``summary.json``, ``report.html``.
        framework: ``keras``, ``lightning`` or ``hf``.
        name: the run's name (default: the folder's name).
        dataset_files: the dataset's files, for page-cache residency.
        interval_s: sampling period of the system samplers (seconds).
        tensorboard: also write TensorBoard event files here at the end.
        quiet: print nothing (by default one line at the end names the verdict and the report).
    """

    def __init__(self, out: str | Path, framework: str, *, name: str | None = None,
                 dataset_files: Sequence[str | Path] = (), interval_s: float = 1.0,
                 tensorboard: str | Path | None = None, quiet: bool = False) -> None:
        self.run_dir = Path(out)
        self.framework = framework
        # free-form: Monitor's keyword arguments, as the callback's caller gave them
        self._options: dict[str, Any] = {"name": name, "dataset_files": dataset_files,
                                         "interval_s": interval_s}
        self.tensorboard = None if tensorboard is None else Path(tensorboard)
        self.quiet = quiet
        self.recording: CallbackRecording | None = None
        self.result: FinishedRun | None = None

    def begin(self) -> bool:
        """Start recording; False (with a warning) when another recording is active here."""
        if self.recording is not None:
            return True
        stale = _CURRENT[0] if _CURRENT else None
        if stale is not None and stale is not self and stale.recording is not None:
            # One training loop runs at a time in a process: a new one starting means the last
            # one is over. Keras and the HF Trainer do not call back when training raises, so
            # that run was left open; close it now as failed, so this one can record.
            stale.note("closed when another training run started in this process: the "
                       "framework did not report this run's end (it probably raised)")
            stale.end("failed")
        if recording_active():
            warnings.warn(f"stepscope: another run is being recorded in this process; "
                          f"{self.run_dir} is not recorded", RuntimeWarning, stacklevel=3)
            return False
        self.recording = CallbackRecording(self.run_dir, framework=self.framework,
                                           **self._options)
        self.recording.start()
        _CURRENT[:] = [self]
        return True

    def note(self, text: str) -> None:
        if self.recording is not None:
            self.recording.note(text)

    def end(self, status: str = "completed") -> FinishedRun | None:
        """Stop recording and write ``summary.json`` and ``report.html`` (idempotent)."""
        recording, self.recording = self.recording, None
        if recording is None:
            return self.result
        recording.close(status)
        self.result = finish_run(self.run_dir, tensorboard=self.tensorboard)
        if not self.quiet:
            head = self.result.answers[0].title if self.result.answers else "recorded"
            print(f"stepscope: {head}. Report: {self.result.report}", file=sys.stderr)
        return self.result
