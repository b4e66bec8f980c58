"""``stepscope.show(run_dir)``: a run's report inside Jupyter, its explanation in a terminal.

Examples:
    >>> import stepscope
    >>> stepscope.show("runs/mine")      # in a notebook cell: the report, inline
    >>> print(stepscope.show("runs/mine"))  # anywhere: the explanation as text

The inline view is ``report.html`` itself (the same sections, one self-contained page with
inline SVG and CSS, no script) placed in an ``<iframe srcdoc=...>``: the report's styles stay
inside the frame instead of restyling the notebook, and the notebook file stays self-contained.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from pathlib import Path

from stepscope.analysis.contracts_summary import Summary
from stepscope.analysis.explain import Answer

FRAME_HEIGHT_PX = 900


@dataclass(frozen=True)
class RunView:
    """One analysed run, displayable: ``_repr_html_`` for Jupyter, ``str`` for terminals."""

    run_dir: Path
    summary: Summary
    answers: list[Answer]
    report_html: str

    def _repr_html_(self) -> str:
        name = html.escape(str((self.summary.get("run") or {}).get("name") or self.run_dir.name))
        return (f'<iframe title="stepscope report: {name}" srcdoc="{html.escape(self.report_html)}"'
                f' style="width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ddd"></iframe>')

    def text(self, width: int = 100) -> str:
        """The phase table and the explanation as plain text (no colour codes)."""
        from rich.console import Console

        from stepscope.render import terminal

        buf = io.StringIO()
        # Inside a kernel rich would send the output to Jupyter's display instead of the buffer.
        console = Console(file=buf, width=width, color_system=None, highlight=False,
                          force_terminal=False, force_jupyter=False)
        if self.summary.get("phases"):
            console.print(terminal.phase_table(self.summary))
        console.print(terminal.explanation(self.answers))
        console.print(f"report: {self.run_dir / 'report.html'}")
        return buf.getvalue()

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()


def show(run_dir: str | Path) -> RunView:
    """Analyse ``run_dir`` (as ``stepscope report`` does: summary.json and report.html are
    written) and return a view of it.

    Args:
        run_dir: a run directory recorded by ``train``, ``watch``, a Monitor or a callback.

    Returns:
        A :class:`RunView`: the last expression of a notebook cell renders the report inline;
        ``print()`` shows the explanation.

    Raises:
        StepscopeError: not a run directory.
    """
    from stepscope.finish import finish_run

    done = finish_run(Path(run_dir))
    return RunView(done.run_dir, done.summary, done.answers,
                   done.report.read_text(encoding="utf-8"))
