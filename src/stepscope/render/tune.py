"""Terminal view of ``stepscope tune``: every measurement with its spread, the winner marked, and
one sentence of why it won.

It reads the tune result by shape (the protocols below), not by importing the trainer: render/
does not import train/.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.fmt import MISSING, fmt_pct, fmt_rate, fmt_ratio
from stepscope.analysis.tune import TuneRowLike
from stepscope.reports import TunedSettings

_SECTIONS = {
    "compute": "compute ceiling (trunk only, batch in memory)",
    "loader": "loader only (nothing consumes the batches)",
    "run": "short real runs (these decide)",
}


class TuneRowView(TuneRowLike, Protocol):
    """What the table reads from one measurement: what the decision reads, and the winner and
    prediction marks."""

    @property
    def predicted_images_per_s(self) -> float | None: ...
    @property
    def capacity_speedup(self) -> float | None: ...
    @property
    def achieved_speedup(self) -> float | None: ...
    @property
    def winner(self) -> bool: ...


class TuneResultView(Protocol):
    """What the table reads from a tune (``stepscope.train.tune.TuneResult``)."""

    @property
    def rows(self) -> Sequence[TuneRowView]: ...
    @property
    def winner(self) -> TunedSettings: ...
    @property
    def reason(self) -> str: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def budget_s(self) -> float: ...
    @property
    def elapsed_s(self) -> float: ...
    @property
    def device(self) -> str: ...


def _spread(row: TuneRowView) -> str:
    if row.min_images_per_s is None or row.max_images_per_s is None:
        return ""
    return f"{fmt_rate(row.min_images_per_s)}–{fmt_rate(row.max_images_per_s)}"


def _mark(row: TuneRowView) -> Text:
    if row.winner:
        return Text("★ winner", style="bold green")
    return Text("yours", style="cyan") if row.baseline else Text("")


def _add_row(table: Table, row: TuneRowView) -> None:
    if row.skipped:
        table.add_row(Text(""), Text(f"{row.label} (skipped: {row.skipped})", style="dim"), MISSING,
                      "", "", "", "", "")
        return
    wait = "" if row.data_wait_frac is None else fmt_pct(row.data_wait_frac)
    predicted = "" if row.predicted_images_per_s is None else fmt_rate(row.predicted_images_per_s)
    achieved = "" if row.achieved_speedup is None else fmt_ratio(row.achieved_speedup)
    model = "" if row.capacity_speedup is None else fmt_ratio(row.capacity_speedup)
    style = "bold" if row.winner else ""
    table.add_row(_mark(row), Text(row.label, style=style),
                  Text(fmt_rate(row.images_per_s), style=style), _spread(row), predicted,
                  achieved, model, wait)


def tune_table(result: TuneResultView) -> RenderableType:
    """The tune's measurements by kind, the winner marked, why it won, and the notes.

    Examples:
        >>> from rich.console import Console
        >>> Console().print(tune_table(result))  # doctest: +SKIP
    """
    table = Table(title=f"stepscope tune: {result.elapsed_s:.0f} s of a {result.budget_s:.0f} s "
                  f"budget on {result.device}", title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("measured", overflow="fold")
    table.add_column("img/s", justify="right", no_wrap=True)
    table.add_column("min–max", justify="right", no_wrap=True)
    table.add_column("predicted", justify="right", no_wrap=True)
    table.add_column("× yours", justify="right", no_wrap=True)
    table.add_column("model ×", justify="right", no_wrap=True)
    table.add_column("data wait", justify="right", no_wrap=True)
    for kind, title in _SECTIONS.items():
        rows = [r for r in result.rows if r.kind == kind]
        if not rows:
            continue
        if table.row_count:
            table.add_section()
        table.add_row("", Text(title, style="italic"), "", "", "", "", "", "")
        for row in rows:
            _add_row(table, row)
    winner = ", ".join(f"{k}={v}" for k, v in result.winner.items())
    parts: list[RenderableType] = [
        table,
        Text.assemble(("winner: ", "bold green"), winner),
        Text.assemble(("why: ", "bold"), result.reason),
    ]
    if any(r.achieved_speedup is not None for r in result.rows):
        parts.append(Text("× yours: this run's measured img/s ÷ your settings' run", style="dim"))
    if any(r.capacity_speedup is not None for r in result.rows):
        parts.append(Text("model ×: the speed-up the capacity model predicted from your run's "
                          "stage capacities (read, decode, transform, collate per image; the "
                          "cores the job may use), for runs that change the worker count only",
                          style="dim"))
    parts += [Text(f"note: {n}", style="dim") for n in result.notes]
    return Group(*parts)
