"""Terminal views of a run's analysis (rich renderables): the phase table, answers, comparisons.

Every function takes plain analysis results (``summary.json`` dicts, a
:class:`~stepscope.analysis.compare.Comparison`, explanation answers) and returns a rich
renderable; nothing here measures anything. Byte figures are decimal (1 MB = 10^6 bytes), as
disk tools and nvidia-smi's "MB" in the seed's question are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.compare import Comparison
from stepscope.analysis.contracts_summary import PhaseRow, RankRow, Summary
from stepscope.analysis.fmt import (
    MISSING,
    fmt_bytes,
    fmt_num,
    fmt_pct,
    fmt_pct_value,
    fmt_ratio,
    fmt_span,
)

VERDICT_STYLE = {
    "input-bound": "bold red",
    "transfer-bound": "bold yellow",
    "overhead-bound": "yellow",
    "compute-bound": "green",
}


class AnswerLike(Protocol):
    """An explanation answer (``analysis.summary.Answer``): a question-like title and its text."""

    @property
    def title(self) -> str: ...

    @property
    def text(self) -> str: ...


def fmt_verdict(verdict: str | None, cause: str | None) -> str:
    """``input-bound (cpu)``: the verdict with what starves the input pipeline, if known."""
    if not verdict:
        return MISSING
    return f"{verdict} ({cause})" if cause else verdict


def phase_verdict(p: PhaseRow) -> str:
    """A phase's verdict as shown in tables; phases served from the feature cache say so."""
    text = fmt_verdict(p.get("verdict"), p.get("input_cause"))
    return "cached features" if p.get("feature_cache") else text


def fmt_residency(start: float | None, end: float | None) -> str:
    """Share of the dataset in the page cache at a phase's start → end ("0→82 %": the unit
    once, so that the column fits 80 columns unbroken).

    Examples:
        >>> fmt_residency(0.0, 0.82), fmt_residency(None, 1.0), fmt_residency(None, None)
        ('0→82 %', '—→100 %', '—')
    """
    if start is None or end is None:
        return fmt_span(fmt_pct(start), fmt_pct(end))
    return f"{fmt_pct(start).removesuffix(' %')}→{fmt_pct(end)}"


# -- tables ---------------------------------------------------------------------------------------
def _table(title: str | None = None) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                 title_justify="left", title_style="bold")


def phase_table(summary: Summary) -> Table:
    """Per epoch x phase: throughput, where step time went, the verdict, disk and page cache.

    Examples:
        >>> Console().print(phase_table(load_summary(Path("runs/demo"))))
    """
    t = _table("Epochs and phases (steady-state steps)")
    t.collapse_padding = True  # two spaces between columns: nine fit 80 columns
    phases = summary.get("phases") or []
    # A CPU run copies nothing to a device: its copy column would be 0 % in every row.
    copy = (summary.get("run") or {}).get("device") != "cpu"
    t.add_column("epoch", no_wrap=True)
    for name in ("img/s", "wait", *(["copy"] if copy else []), "comp"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("verdict", min_width=14, overflow="fold")  # wraps rather than vanishing at 80 columns
    # The system columns, each with its caption; one that no phase measured (GPU on a CPU run,
    # residency without the dataset's files) is left out, so that the rest fit 80 columns.
    extra = [(name, words, cells) for name, words, cells in (
        ("disk", "disk = bytes read from the device",
         [fmt_bytes(p.get("disk_read_bytes")) for p in phases]),
        ("cache", "cache = bytes served by the page cache",
         [fmt_bytes(p.get("cache_read_bytes")) for p in phases]),
        ("resident", "resident = share of the dataset in the page cache at start→end",
         [fmt_residency(p.get("dataset_resident_frac_start"), p.get("dataset_resident_frac_end"))
          for p in phases]),
        ("CPU", "CPU = mean over cores", [fmt_pct_value(p.get("cpu_util_pct")) for p in phases]),
        ("GPU", "GPU = NVML utilization", [fmt_pct_value(p.get("gpu_util_pct")) for p in phases]),
    ) if any(c != MISSING for c in cells)]
    for name, _, _ in extra:  # these may wrap at 80 columns so that the verdict keeps its room
        t.add_column(name, justify="right", no_wrap=name == "resident")
    for i, p in enumerate(phases):
        verdict = phase_verdict(p)
        t.add_row(
            f"{p.get('epoch', '')} {p.get('phase', '')}",
            fmt_num(p.get("images_per_s")), fmt_pct(p.get("data_wait_frac")),
            *([fmt_pct(p.get("transfer_frac"))] if copy else []), fmt_pct(p.get("compute_frac")),
            Text(verdict, style=VERDICT_STYLE.get(str(p.get("verdict")), "")),
            *(cells[i] for _, _, cells in extra),
        )
    shares = "wait = blocked on the data loader, " + ("copy = host→device, " if copy else "") \
        + "comp = forward + backward + optimizer (shares of step time)"
    # folded, not cropped: a caption line wider than the table lost its end at 80 columns
    t.caption = Text("; ".join([shares] + [words for _, words, _ in extra]), overflow="fold")
    t.caption_justify = "left"
    return t


RANK_ROWS_MAX = 16


def rank_order(rows: list[RankRow]) -> list[RankRow]:
    """Stragglers and failed ranks first, then by rank; at most ``RANK_ROWS_MAX``."""
    def key(r: RankRow) -> tuple[bool, bool, int]:
        return (not r.get("straggler"), r.get("status") not in ("failed", "interrupted"),
                int(r["rank"]))
    return sorted(rows, key=key)[:RANK_ROWS_MAX]


def rank_table(summary: Summary) -> Table | None:
    """Per rank of a distributed run, grouped by node: how it ended, its step split, how often
    it arrived last at the gradient all-reduce, and whether the others waited for it."""
    rows = summary.get("ranks") or []
    if len(rows) < 2 or "rank" not in rows[0]:
        return None
    t = _table("Ranks (training steps, per step)")
    for name in ("node", "rank", "ended"):
        t.add_column(name, no_wrap=True)
    for name in ("step ms", "wait", "comp", "allred", "last"):
        t.add_column(name, justify="right", no_wrap=True)
    t.add_column("straggler", min_width=18, overflow="fold")
    shown = rank_order(rows)
    for r in sorted(shown, key=lambda r: (str(r.get("host")), r.get("node_rank") or 0,
                                          int(r["rank"]))):
        node = str(r.get("host") or "?") + (f" #{r['node_rank']}"
                                            if r.get("node_rank") is not None else "")
        why = ""
        if r.get("straggler"):
            why = ", ".join(str(x) for x in (r.get("cause"), r.get("recurrence")) if x) or "yes"
        t.add_row(node, str(r["rank"]), str(r.get("status") or "—"),
                  _ms(r.get("step_ms", r.get("wall_ms_per_step"))),
                  _ms(r.get("data_wait_ms_per_step")), _ms(r.get("compute_ms_per_step")),
                  _ms(r.get("comm_ms_per_step")), fmt_pct(r.get("arrived_last_frac")),
                  Text(why, style="bold red" if why else ""))
    more = len(rows) - len(shown)
    t.caption = ("ms per step: wait = data wait, comp = forward+backward+optimizer without the "
                 "all-reduce, allred = gradient all-reduce in flight (includes waiting for others); "
                 "last = share of all-reduces this rank reached last"
                 + (f"; {more} more ranks in summary.json" if more > 0 else ""))
    t.caption_justify = "left"
    return t


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def explanation(answers: Iterable[AnswerLike]) -> Group:
    """Answers to "why?" questions, each a bold title over its text."""
    parts: list[RenderableType] = []
    for i, a in enumerate(answers):
        if i:
            parts.append(Text(""))
        parts.append(Text(str(a.title), style="bold"))
        parts.append(Text(str(a.text)))
    return Group(*parts) if parts else Group(Text("No explanation available."))


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
                  fmt_span(fmt_pct(p.a_data_wait_frac), fmt_pct(p.b_data_wait_frac)),
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
    if cmp.predicted:
        parts.append(_predicted_table(cmp))
    if cmp.findings_resolved or cmp.findings_new:
        parts.append(Text(f"findings resolved: {', '.join(cmp.findings_resolved) or 'none'}; "
                          f"new: {', '.join(cmp.findings_new) or 'none'}"))
    return Group(*parts)


def _predicted_table(cmp: Comparison) -> Table:
    """What run a's capacities predicted for b's change, beside what b achieved."""
    t = _table("Predicted (from a's stage capacities) vs achieved")
    for name in ("epoch", "phase", "change", "predicted", "achieved", "error"):
        t.add_column(name, justify="right" if name in ("predicted", "achieved", "error",
                                                       "epoch") else "left", no_wrap=True)
    for g in cmp.predicted:
        t.add_row(str(g.epoch), g.phase, g.change, fmt_ratio(g.predicted), fmt_ratio(g.achieved),
                  f"{g.error_frac:+.0%}")
    return t


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
        return MISSING
    return ("+" if v > 0 else "") + fmt_bytes(v)
