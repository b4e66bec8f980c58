"""The end of every recorded run: analyse ``run.db``, write ``summary.json`` and ``report.html``.

The CLI (``train``, ``watch``, ``report``), the framework callbacks (``stepscope.keras``,
``stepscope.lightning``, ``stepscope.hf``) and notebooks (``stepscope.show``) all finish a run
through :func:`finish_run`, so a run directory looks the same whoever recorded it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.analysis.contracts_summary import Summary
from stepscope.analysis.explain import Answer

if TYPE_CHECKING:
    from stepscope.tblive import LiveTensorBoard


@dataclass(frozen=True)
class FinishedRun:
    """What finishing a run produced: the summary, the explanation and the files written."""

    run_dir: Path
    summary: Summary
    answers: list[Answer]
    report: Path
    tensorboard: Path | None = None


def finish_run(run_dir: Path, *, tensorboard: Path | None = None,
               live: LiveTensorBoard | None = None) -> FinishedRun:
    """Analyse a recorded run and write its summary and report (and TensorBoard files).

    Args:
        run_dir: the run directory (holds ``run.db``).
        tensorboard: also write TensorBoard event files into this folder.
        live: the TensorBoard follower that wrote the run's steps and samples while it ran;
            it gets the end-of-run figures and words instead of a new export.

    Returns:
        The summary dict (``summary.json``), the answers and the paths written.

    Examples:
        >>> done = finish_run(Path("runs/mine"))
        >>> done.report.name
        'report.html'
    """
    from stepscope.analysis import summary as summ
    from stepscope.analysis.explain import explain
    from stepscope.analysis.timeline import load_timeline
    from stepscope.render import html
    from stepscope.store.db import RunReader
    from stepscope.store.rundir import RunDir

    run_dir = Path(run_dir)
    result = summ.write_summary(run_dir)
    answers = explain(result)
    with RunReader(run_dir) as reader:
        timeline = load_timeline(reader)
        config = reader.run().config
    report = html.write_report(RunDir(run_dir).report, result, timeline, answers, config)
    if live is not None:
        tensorboard = live.finish(result, answers)
    elif tensorboard is not None:
        from stepscope.render.tensorboard import write_tensorboard

        write_tensorboard(tensorboard, result, timeline, answers)
    return FinishedRun(run_dir, result, answers, report, tensorboard)
