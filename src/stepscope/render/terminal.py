"""Terminal views of a run's analysis (rich renderables) and the live progress-line extras.

Every function takes plain analysis results (``summary.json`` dicts, a
:class:`~stepscope.analysis.compare.Comparison`, explanation answers) and returns a rich
renderable; nothing here measures anything. Byte figures are decimal (1 MB = 10^6 bytes), as
disk tools and nvidia-smi's "MB" in the seed's question are.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stepscope.analysis.compare import Comparison

VERDICT_STYLE = {
    "input-bound": "bold red",
    "transfer-bound": "bold yellow",
    "overhead-bound": "yellow",
    "compute-bound": "green",
}
SEVERITY_STYLE = {"critical": "bold red", "high": "bold red", "warning": "yellow",
                  "medium": "yellow", "info": "cyan", "low": "cyan"}


class AnswerLike(Protocol):
    """An explanation answer (``analysis.summary.Answer``): a question-like title and its text."""

    @property
    def title(self) -> str: ...

    @property
    def text(self) -> str: ...


# -- number formatting (shared with the HTML report) ---------------------------------------------
def fmt_bytes(n: float | None) -> str:
    """Decimal bytes, three significant digits: ``fmt_bytes(6.5e9) == '6.5 GB'``;
    ``None`` shows as an em dash."""
    if n is None:
        return "—"
    sign, v = ("-" if n < 0 else ""), abs(float(n))
    for unit in ("B", "kB", "MB", "GB"):
        if round(v, 1) < 1000:
            return f"{sign}{v:.3g} {unit}" if unit != "B" else f"{sign}{v:.0f} B"
        v /= 1000
    return f"{sign}{v:.3g} TB"


def fmt_pct(frac: float | None) -> str:
    """A 0-1 fraction as a whole percentage."""
    return "—" if frac is None else f"{100 * frac:.0f}%"


def fmt_num(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None else f"×{r:.2f}"


def fmt_verdict(verdict: str | None, cause: str | None) -> str:
    """``input-bound (cpu)``: the verdict with what starves the input pipeline, if known."""
    if not verdict:
        return "—"
    return f"{verdict} ({cause})" if cause else verdict


def phase_verdict(p: dict[str, Any]) -> str:
    """A phase's verdict as shown in tables; phases served from the feature cache say so."""
    text = fmt_verdict(p.get("verdict"), p.get("input_cause"))
    return "cached features" if p.get("feature_cache") else text


def fmt_residency(start: float | None, end: float | None) -> str:
    if start is None and end is None:
        return "—"
    return f"{fmt_pct(start)}→{fmt_pct(end)}"


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A Console that writes plain text to pipes and files and honours ``NO_COLOR``.

    Rich would otherwise guess from environment variables (e.g. ``FORCE_COLOR``, ``TERM``) and
    could put escape codes into a log file that a CI system captures.
    """
    stream = file if file is not None else sys.stdout
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(
        file=stream, width=width, force_terminal=None if is_tty else False,
        no_color=bool(os.environ.get("NO_COLOR")) or None,
    )


# -- tables ---------------------------------------------------------------------------------------
def _table(title: str | None = None) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                 title_justify="left", title_style="bold")


def phase_table(summary: dict[str, Any]) -> Table:
    """Per epoch x phase: throughput, where step time went, the verdict, disk and page cache.

    Examples:
        >>> make_console().print(phase_table(json.load(open("runs/demo/summary.json"))))
    """
    t = _table("Epochs and phases (steady-state steps)")
    t.add_column("epoch", no_wrap=True)
    for name in ("img/s", "wait", "copy", "comp"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("verdict", min_width=14, overflow="fold")  # wraps rather than vanishing at 80 columns
    # These may wrap at 80 columns so that the verdict keeps its room.
    for name in ("disk", "cache", "resident", "CPU", "GPU"):
        t.add_column(name, justify="right")
    for p in summary.get("phases") or []:
        verdict = phase_verdict(p)
        t.add_row(
            f"{p.get('epoch', '')} {p.get('phase', '')}",
            fmt_num(p.get("images_per_s")), fmt_pct(p.get("data_wait_frac")),
            fmt_pct(p.get("transfer_frac")), fmt_pct(p.get("compute_frac")),
            Text(verdict, style=VERDICT_STYLE.get(str(p.get("verdict")), "")),
            fmt_bytes(p.get("disk_read_bytes")), fmt_bytes(p.get("cache_read_bytes")),
            fmt_residency(p.get("dataset_resident_frac_start"),
                          p.get("dataset_resident_frac_end")),
            _pct_value(p.get("cpu_util_pct")), _pct_value(p.get("gpu_util_pct")),
        )
    t.caption = ("wait = blocked on the data loader, copy = host→device, comp = forward+backward+"
                 "optimizer (shares of step time); disk = bytes read from the device, cache = "
                 "bytes served by the page cache; resident = share of the dataset in the page "
                 "cache at start→end; CPU = mean over cores, GPU = NVML utilization")
    t.caption_justify = "left"
    return t


def _pct_value(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f}%"


def _evidence_lines(evidence: Any) -> list[str]:
    if evidence is None or evidence == "":
        return []
    if isinstance(evidence, dict):
        return [f"{k}: {v}" for k, v in evidence.items()]
    if isinstance(evidence, (list, tuple)):
        return [str(e) for e in evidence]
    return [str(evidence)]


def _finding_text(f: dict[str, Any]) -> Text:
    sev = str(f.get("severity") or "info")
    out = Text()
    out.append(f"[{sev}] ", style=SEVERITY_STYLE.get(sev, ""))
    out.append(str(f.get("title") or f.get("id") or "finding"), style="bold")
    for line in _evidence_lines(f.get("evidence")):
        out.append(f"\n  evidence: {line}")
    if f.get("fix"):
        out.append(f"\n  fix: {f['fix']}")
    if f.get("expected_gain"):
        out.append(f"\n  expected gain: {f['expected_gain']}")
    return out


def findings_panel(summary: dict[str, Any]) -> Panel:
    """The findings, most severe first as the analysis ordered them, with evidence and fixes."""
    findings = summary.get("findings") or []
    if not findings:
        body: RenderableType = Text("No findings: nothing measured stands out.")
    else:
        parts: list[Text] = []
        for i, f in enumerate(findings):
            if i:
                parts.append(Text(""))
            parts.append(_finding_text(f))
        body = Group(*parts)
    return Panel(body, title="Findings", title_align="left", box=box.ROUNDED)


def explanation(answers: Iterable[AnswerLike]) -> Group:
    """Answers to "why?" questions, each a bold title over its text."""
    parts: list[RenderableType] = []
    for i, a in enumerate(answers):
        if i:
            parts.append(Text(""))
        parts.append(Text(str(a.title), style="bold"))
        parts.append(Text(str(a.text)))
    return Group(*parts) if parts else Group(Text("No explanation available."))


def memory_table(summary: dict[str, Any]) -> Table:
    """The memory ledger: what each item holds, how it was measured, what is left unexplained."""
    mem = summary.get("memory") or {}
    total = mem.get("total_bytes")
    t = _table(f"Memory on {mem.get('device') or '?'}: {fmt_bytes(total)} in use")
    t.add_column("item")
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("how measured")
    for row in mem.get("ledger") or []:
        t.add_row(str(row.get("item")), fmt_bytes(row.get("bytes")),
                  _share(row.get("bytes"), total), str(row.get("how_measured") or ""))
    if mem.get("unattributed_bytes") is not None:
        t.add_row("unattributed", fmt_bytes(mem["unattributed_bytes"]),
                  _share(mem["unattributed_bytes"], total), "total − the items above",
                  style="italic")
    return t


def _share(part: float | None, total: float | None) -> str:
    if part is None or not total:
        return "—"
    return fmt_pct(part / total)


def comparison_table(cmp: Comparison) -> Group:
    """Run b against run a: per-phase speed-up, data-wait change, verdict changes, memory."""
    t = _table(f"{cmp.b_name} vs {cmp.a_name}")
    for name in ("epoch", "phase", "a img/s", "b img/s", "b÷a", "wait a→b"):
        t.add_column(name, justify="left" if name == "phase" else "right", no_wrap=True)
    t.add_column("verdict a → b")
    for p in cmp.phases:
        change = (f"{fmt_verdict(p.a_verdict, p.a_input_cause)} → "
                  f"{fmt_verdict(p.b_verdict, p.b_input_cause)}"
                  if p.verdict_changed else fmt_verdict(p.a_verdict, p.a_input_cause))
        t.add_row(str(p.epoch), p.phase, fmt_num(p.a_images_per_s), fmt_num(p.b_images_per_s),
                  fmt_ratio(p.ratio),
                  f"{fmt_pct(p.a_data_wait_frac)}→{fmt_pct(p.b_data_wait_frac)}",
                  Text(change, style="bold" if p.verdict_changed else ""))
    head = Text()
    head.append("training: ", style="bold")
    head.append(f"{fmt_num(cmp.train_images_per_s_a)} → {fmt_num(cmp.train_images_per_s_b)} "
                f"img/s ({fmt_ratio(cmp.train_ratio)})")
    head.append("   validation: ", style="bold")
    head.append(f"{fmt_num(cmp.val_images_per_s_a)} → {fmt_num(cmp.val_images_per_s_b)} "
                f"img/s ({fmt_ratio(cmp.val_ratio)})")
    parts: list[RenderableType] = [head, t]
    parts += _unmatched(cmp)
    if cmp.memory:
        parts.append(_memory_delta_table(cmp))
    if cmp.findings_resolved or cmp.findings_new:
        parts.append(Text(f"findings resolved: {', '.join(cmp.findings_resolved) or 'none'}; "
                          f"new: {', '.join(cmp.findings_new) or 'none'}"))
    return Group(*parts)


def _unmatched(cmp: Comparison) -> list[RenderableType]:
    out: list[RenderableType] = []
    for label, keys in (("only in a", cmp.only_in_a), ("only in b", cmp.only_in_b)):
        if keys:
            out.append(Text(f"{label}: " + ", ".join(f"epoch {e} {p}" for e, p in keys)))
    return out


def _memory_delta_table(cmp: Comparison) -> Table:
    t = _table("Memory ledger")
    for name in ("item", "a", "b", "b − a"):
        t.add_column(name, justify="left" if name == "item" else "right", no_wrap=True)
    for d in cmp.memory:
        t.add_row(d.item, fmt_bytes(d.a_bytes), fmt_bytes(d.b_bytes), _signed(d.delta_bytes))
    total_delta = (None if cmp.memory_total_a is None or cmp.memory_total_b is None
                   else cmp.memory_total_b - cmp.memory_total_a)
    t.add_row("total", fmt_bytes(cmp.memory_total_a), fmt_bytes(cmp.memory_total_b),
              _signed(total_delta), style="bold")
    return t


def _signed(v: float | None) -> str:
    if v is None:
        return "—"
    return ("+" if v > 0 else "") + fmt_bytes(v)


# -- live progress-line extras ----------------------------------------------------------------------
@dataclass
class LiveStatus:
    """The extras on a training progress line: ``wait 42% · CPU 61% · GPU 30% · disk 12.0 MB/s``.

    It is fed values (by the trainer, from the monitor's latest samples) and never samples
    anything itself; a value not yet known (or absent, like the GPU on a CPU run) is left out.

    Examples:
        >>> s = LiveStatus()
        >>> s.update(data_wait_frac=0.42, cpu_util_pct=61.0, disk_read_bytes_per_s=12e6)
        >>> s.plain()
        'wait 42% · CPU 61% · disk 12.0 MB/s'
    """

    images_per_s: float | None = None
    data_wait_frac: float | None = None
    cpu_util_pct: float | None = None
    gpu_util_pct: float | None = None
    disk_read_bytes_per_s: float | None = None

    _FIELDS = ("images_per_s", "data_wait_frac", "cpu_util_pct", "gpu_util_pct",
               "disk_read_bytes_per_s")

    def update(self, stats: object | None = None, **values: float | None) -> None:
        """Take new values from keyword arguments or from any object with the same attribute
        names (e.g. the monitor's ``LiveStats``)."""
        for name in self._FIELDS:
            if stats is not None and hasattr(stats, name):
                setattr(self, name, getattr(stats, name))
            if name in values:
                setattr(self, name, values[name])

    def _parts(self) -> Sequence[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        if self.images_per_s is not None:
            parts.append((f"{self.images_per_s:.1f} img/s", ""))
        if self.data_wait_frac is not None:
            style = "red" if self.data_wait_frac >= 0.2 else ""
            parts.append((f"wait {fmt_pct(self.data_wait_frac)}", style))
        if self.cpu_util_pct is not None:
            parts.append((f"CPU {self.cpu_util_pct:.0f}%", ""))
        if self.gpu_util_pct is not None:
            parts.append((f"GPU {self.gpu_util_pct:.0f}%", ""))
        if self.disk_read_bytes_per_s is not None:
            parts.append((f"disk {fmt_bytes(self.disk_read_bytes_per_s)}/s", ""))
        return parts

    def plain(self) -> str:
        return " · ".join(text for text, _ in self._parts())

    def __rich__(self) -> Text:
        out = Text()
        for i, (text, style) in enumerate(self._parts()):
            if i:
                out.append(" · ", style="dim")
            out.append(text, style=style)
        return out
