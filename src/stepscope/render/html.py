"""The self-contained HTML report: one file, inline SVG and CSS, no script, opens offline.

It is written for someone who has never seen stepscope: every chart has axis units, a legend
and a sentence on how to read it. Every string that came from the user or the machine (file
names, class names, command lines, config values, notes) is escaped. The size is bounded by
the timeline's bucket count, not by the run's length.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.analysis.contracts_summary import Summary
from stepscope.analysis.fmt import (
    MISSING,
    fmt_bytes,
    fmt_duration,
    fmt_num,
    fmt_pct,
    fmt_pct_value,
)
from stepscope.analysis.timeline import Series, Timeline, sum_series
from stepscope.atomic import atomic_write_text
from stepscope.render.html_page import empty, how, page, section
from stepscope.render.html_ranks import ranks_section
from stepscope.render.html_series import Look, chart_parts, section_names, series_charts
from stepscope.render.input_charts import input_section_parts, throughput_chart
from stepscope.render.svg import (
    PALETTE,
    PHASE_FILL,
    Band,
    Bar,
    Line,
    bar_chart,
    esc,
    heatmap,
    legend,
    time_chart,
    waterfall,
)
from stepscope.render.terminal import (
    AnswerLike,
    fmt_residency,
    phase_verdict,
)

# A section's title and the HTML parts under it.
Body = tuple[str, list[str]]

PART_COLORS = {"wait": "#e15759", "copy": "#edc948", "compute": "#4e79a7", "other": "#bab0ac"}
NVML_NOTE = (
    "NVML's “GPU utilization” is the share of time in which at least one kernel was running "
    "on the GPU, not how busy its compute units were: one small kernel at a time reads 100 %. "
    "The step split below (wait / copy / compute) is the better evidence of what limits speed."
)
_MAX_PROCESS_LINES = 6


def _when(t: float | None) -> str:
    if not t:
        return MISSING
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- timeline helpers ---------------------------------------------------------------------------
def _bands(tl: Timeline) -> list[Band]:
    return [Band(p.started, p.ended, p.phase,
                 f"e{p.epoch}" if p.phase == "train" else f"epoch {p.epoch} val")
            for p in tl.phases]


def _band_legend() -> list[tuple[str, str, str]]:
    return [("train phase", PHASE_FILL["train"], "band"), ("validation phase", PHASE_FILL["val"],
                                                          "band")]


def _line(s: Series, label: str, color: str, scale: float = 1.0, width: float = 1.5) -> Line:
    return Line(label, s.t, [v * scale for v in s.mean], [v * scale for v in s.lo],
                [v * scale for v in s.hi], color, width)


def _chart(tl: Timeline, lines: list[Line], *, unit: str, y_label: str,
           y_max: float | None = None, height: int = 230) -> str:
    svg = time_chart(lines, _bands(tl), tl.t0, tl.t1, unit=unit, y_label=y_label, y_max=y_max,
                     height=height, gap_s=3 * tl.bucket_s)
    keys = [(ln.label, ln.color, "box" if ln.fill else "line") for ln in lines]
    return svg + legend(keys + _band_legend())


# The prose and drawing of the registry's charts (stepscope.metrics.CHARTS); a charted series
# whose chart is not listed here is still drawn, with its registered meaning as the note.
_LOOKS: dict[tuple[str, str], Look] = {
    ("cpu", "CPU busy (%)"): Look(
        how="The machine's CPU: 100 % means every core was busy. The light band around the line "
            "spans the lowest and highest sample in each time slice, so short bursts stay "
            "visible. Blue background: training; orange: validation.", width=2),
    ("gpu", "GPU utilization (%)"): Look(
        how="Share of each sampling interval in which the GPU ran at least one kernel."),
    ("gpu", "GPU memory"): Look(
        how="What nvidia-smi shows (used) against what the framework holds (reserved) and what "
            "tensors really use (allocated). A gap between used and reserved is the CUDA "
            "context and other processes."),
    ("disk", "read rate"): Look(
        how="Red: bytes the training's processes read from the storage device. Green: bytes "
            "they read that the operating system served from its page cache (memory) instead. "
            "Once the dataset is cached, red drops to zero while green stays: the program "
            "still reads every file, the disk does not.", colors=(2, 3, 0, 4)),
    ("disk", "dataset cached (%)"): Look(
        how="Share of the dataset's bytes held in the operating system's page cache (checked "
            "with mincore). At 100 % every file read is served from memory.",
        head="Dataset in the page cache",
        empty="Page-cache residency of the dataset was not recorded.", width=2, colors=(3,),
        height=190),
    ("memory", "memory"): Look(
        how="Machine memory in use and in the page cache, and the training's processes. "
            "Forked loading workers share most pages with the main process, so their RSS "
            "counts the same pages again; USS counts each page once."),
}
_KNOWN_SECTIONS = ("cpu", "gpu", "disk", "memory")


def _registered(tl: Timeline, section: str) -> list[str]:
    """The section's charts of sampled series, as the metrics registry lists them."""
    return chart_parts(series_charts(tl, section, _LOOKS), lambda c: _chart(
        tl, c.lines, unit=c.unit, y_label=c.title, y_max=c.y_max, height=c.look.height))


# -- sections: utilization -----------------------------------------------------------------------
def _cpu_section(tl: Timeline) -> Body:
    parts = _registered(tl, "cpu")
    cores = sorted(tl.sources("cpu_util_pct", "cpu"), key=lambda s: (len(s), s))
    if cores:
        rows = [(c, tl.series[(c, "cpu_util_pct")].t, tl.series[(c, "cpu_util_pct")].mean)
                for c in cores]
        parts.append(heatmap(rows, tl.t0, tl.t1, y_label="CPU per core"))
        parts.append(how("One row per core; darker red = busier (white = idle, dark red = "
                          "100 %). A few dark rows and many pale ones mean the work does not "
                          "spread over the cores."))
    parts.append(_process_cpu(tl))
    return "CPU", parts


def _process_cpu(tl: Timeline) -> str:
    by_role: dict[str, list[tuple[str, Series]]] = {"main": [], "worker": [], "child": []}
    for p in tl.processes:
        s = tl.get(f"proc:{p.pid}", "cpu_util_pct")
        if s is not None:
            by_role.setdefault(p.role, []).append((f"{p.name} (pid {p.pid})", s))
    lines: list[Line] = []
    for label, s in by_role["main"]:
        lines.append(_line(s, f"main: {label}", PALETTE[0], width=2))
    workers = by_role["worker"]
    if len(workers) <= _MAX_PROCESS_LINES:
        lines += [_line(s, f"worker: {label}", PALETTE[1 + i % 8]) for i, (label, s)
                  in enumerate(workers)]
    else:
        total = sum_series([s for _, s in workers], "workers", "cpu_util_pct")
        if total is not None:
            lines.append(_line(total, f"all {len(workers)} loading workers (sum)", PALETTE[1]))
    children = sum_series([s for _, s in by_role["child"]], "children", "cpu_util_pct")
    if children is not None:
        lines.append(_line(children, "other child processes (sum)", PALETTE[5]))
    if not lines:
        return empty("No per-process CPU was recorded.")
    return (_chart(tl, lines, unit="pct", y_label="CPU (100 % = one core)")
            + how("CPU time of each process of the training, where 100 % is one core fully "
                   "busy. Loading workers are separate processes: their time is not in the "
                   "main process's figure."))


def _gpu_section(tl: Timeline) -> Body:
    parts = _registered(tl, "gpu")
    if not parts:
        notes = [n for n in tl.notes if n[1].startswith(("gpu", "nvml"))]
        text = "No GPU was recorded in this run" + (
            ": " + "; ".join(n[2] for n in notes) if notes else ".")
        return "GPU", [empty(text)]
    return "GPU", [f'<p class="note">{esc(NVML_NOTE)}</p>', *parts]


def _disk_section(tl: Timeline) -> Body:
    parts = _registered(tl, "disk")
    return "Disk reads", parts or [empty("No disk I/O was recorded.")]


def _memory_section(tl: Timeline) -> Body | None:
    parts = _registered(tl, "memory")
    return ("Host memory", parts) if parts else None


def _more_series(tl: Timeline) -> Body | None:
    """Charted series of sections this page has no place for (a new sampler's own section)."""
    parts = []
    for name in section_names():
        if name not in _KNOWN_SECTIONS and (mine := _registered(tl, name)):
            parts += [f"<h3>{esc(name)}</h3>", *mine]
    return ("More series", parts) if parts else None


# -- sections: steps and phases -------------------------------------------------------------------
def _step_time_chart(tl: Timeline) -> str:
    st = tl.steps
    if not st.t:
        return empty("No steps were recorded.")
    parts = [("wait", st.data_wait_mean), ("copy", st.transfer_mean),
             ("compute", st.compute_mean), ("other", st.other_mean)]
    acc = [0.0] * len(st.t)
    lines = []
    for name, values in parts:
        acc = [a + 1000 * v for a, v in zip(acc, values, strict=True)]
        lines.append(Line(_PART_LABEL[name], st.t, list(acc), color=PART_COLORS[name], fill=True))
    lines.append(Line("slowest step in the slice", st.t, [1000 * v for v in st.wall_max],
                      color="#222", width=0.8))
    return (_chart(tl, lines, unit="ms", y_label="time per step (ms)")
            + how("Each step's time, split: red = waiting for the data loader, yellow = copying "
                   "the batch to the device, blue = forward + backward + optimizer, grey = the "
                   "rest of the loop. Stacked areas are means per time slice; the thin black "
                   "line is the slowest step in the slice."))


_PART_LABEL = {"wait": "waiting for data", "copy": "host→device copy",
               "compute": "compute (fwd+bwd+opt)", "other": "other loop work"}


def _phase_breakdown(summary: Summary, tl: Timeline) -> str:
    groups: list[tuple[str, list[Bar]]] = []
    for p in summary.get("phases") or []:
        steps, secs = p.get("steps") or 0, p.get("seconds") or 0.0
        if not steps or not secs:
            continue
        per_step_ms = 1000.0 * secs / steps
        fr = {"wait": p.get("data_wait_frac") or 0.0, "copy": p.get("transfer_frac") or 0.0,
              "compute": p.get("compute_frac") or 0.0}
        fr["other"] = max(0.0, 1.0 - sum(fr.values()))
        groups.append((f"{p.get('epoch')} {p.get('phase')}",
                       [Bar(_PART_LABEL[k], per_step_ms * v, PART_COLORS[k], fmt_pct(v))
                        for k, v in fr.items()]))
    if not groups:
        return ""
    return (bar_chart(groups, unit="ms", y_label="ms per step", stacked=True)
            + legend([(_PART_LABEL[k], c, "box") for k, c in PART_COLORS.items()])
            + how("Mean time per step in each epoch and phase (warm-up steps left out), split "
                   "into its parts. A tall red part means the model waits for data: the input "
                   "pipeline, not the model, sets the speed."))


def _throughput(summary: Summary) -> str:
    return throughput_chart(summary, {"train": PALETTE[0], "val": PALETTE[1]})


def _phase_table(summary: Summary) -> str:
    head = ("epoch", "phase", "steps", "img/s", "wait", "copy", "compute", "verdict",
            "disk read", "cached read", "dataset cached", "CPU", "GPU")
    rows = []
    for p in summary.get("phases") or []:
        verdict = str(p.get("verdict") or "")
        cells = [p.get("epoch"), p.get("phase"), p.get("steps"), fmt_num(p.get("images_per_s")),
                 fmt_pct(p.get("data_wait_frac")), fmt_pct(p.get("transfer_frac")),
                 fmt_pct(p.get("compute_frac"))]
        tds = "".join(f"<td>{esc(c)}</td>" for c in cells)
        tds += (f'<td class="l v-{esc(verdict)}">'
                f"{esc(phase_verdict(p))}</td>")
        more = [fmt_bytes(p.get("disk_read_bytes")), fmt_bytes(p.get("cache_read_bytes")),
                fmt_residency(p.get("dataset_resident_frac_start"),
                              p.get("dataset_resident_frac_end")),
                fmt_pct_value(p.get("cpu_util_pct")), fmt_pct_value(p.get("gpu_util_pct"))]
        tds += "".join(f"<td>{esc(c)}</td>" for c in more)
        rows.append(f"<tr>{tds}</tr>")
    if not rows:
        return empty("No phases were recorded.")
    ths = "".join(f'<th class="{"l" if h in ("phase", "verdict") else ""}">{esc(h)}</th>'
                  for h in head)
    return (f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + how("wait / copy / compute: shares of step time. Verdict: what limits the phase "
                   "(input-bound = waiting for data; in brackets, why: storage, CPU or too few "
                   "workers). Disk read: bytes from the device; cached read: bytes served from "
                   "the page cache; dataset cached: at the phase's start → end."))


# -- sections: memory ledger, findings, explanation, configuration ---------------------------------
def _ledger(summary: Summary) -> Body:
    mem = summary.get("memory") or {}
    ledger = mem.get("ledger") or []
    if not ledger and mem.get("total_bytes") is None:
        return "Memory ledger", [empty("No memory ledger was recorded.")]
    items = [(str(r.get("item")), float(r.get("bytes") or 0.0), PALETTE[i % 8])
             for i, r in enumerate(ledger)]
    if unattributed := mem.get("unattributed_bytes"):
        items.append(("unattributed", float(unattributed), "#bab0ac"))
    rows = "".join(
        f"<tr><td class=\"l\">{esc(r.get('item'))}</td><td>{esc(fmt_bytes(r.get('bytes')))}"
        f"</td><td class=\"wrap\">{esc(r.get('how_measured') or '')}</td></tr>" for r in ledger)
    if mem.get("unattributed_bytes") is not None:
        rows += (f"<tr><td class=\"l\"><i>unattributed</i></td><td>"
                 f"{esc(fmt_bytes(mem['unattributed_bytes']))}</td><td class=\"wrap\">total − "
                 "the items above</td></tr>")
    said = ("at most: each process's highest sample in the roll-up slice of the peak, summed"
            if mem.get("total_upper_bound") else "what the device reports in use")
    rows += (f"<tr><th class=\"l\">total</th><th>{esc(fmt_bytes(mem.get('total_bytes')))}</th>"
             f"<th class=\"l\">{esc(said)}</th></tr>")
    return f"Memory ledger: {mem.get('device') or ''}", [
        waterfall(items, mem.get("total_bytes"), unit="bytes", y_label="memory"),
        how("Each bar starts where the previous one ended, so the items add up to the total "
             "the device reports (the dark bar). “unattributed” is what no measurement "
             "explains."),
        f"<table><thead><tr><th class=\"l\">item</th><th>bytes</th><th class=\"l\">how measured"
        f"</th></tr></thead><tbody>{rows}</tbody></table>",
    ]


def _evidence(ev: Any) -> str:
    if isinstance(ev, dict):
        return "<br>".join(f"{esc(k)}: {esc(v)}" for k, v in ev.items())
    if isinstance(ev, (list, tuple)):
        return "<br>".join(esc(e) for e in ev)
    return esc(ev if ev is not None else "")


def _findings(summary: Summary) -> Body:
    out = []
    for f in summary.get("findings") or []:
        sev = str(f.get("severity") or "info")
        rows = [("evidence", _evidence(f.get("evidence"))), ("fix", esc(f.get("fix") or "")),
                ("expected gain", esc(f.get("expected_gain") or ""))]
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows if v)
        out.append(f'<div class="finding {esc(sev)}"><span class="sev">{esc(sev)}</span>'
                   f"<h3>{esc(f.get('title') or f.get('id'))}</h3><dl>{dl}</dl></div>")
    return "Findings", out or [empty("Nothing measured stands out.")]


def _explanation(answers: Sequence[AnswerLike]) -> Body | None:
    out = []
    for a in answers:
        paras = "".join(f"<p>{esc(p)}</p>" for p in str(a.text).split("\n\n") if p.strip())
        out.append(f'<div class="answer"><h3>{esc(a.title)}</h3>{paras}</div>')
    return ("Why the machine behaved so", out) if out else None


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict) and d:
        out = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    text = d if isinstance(d, str) else json.dumps(d, default=str)
    return [(prefix or "(value)", text)]


# free-form: config is the run's configuration as recorded (any loop's keys), shown as a table
def _config(config: dict[str, Any]) -> Body:
    rows = "".join(f'<tr><td class="l mono">{esc(k)}</td><td class="wrap mono">{esc(v)}</td></tr>'
                   for k, v in _flatten(config))
    body = f"<table><tbody>{rows}</tbody></table>" if rows else empty("No configuration.")
    return "Configuration", [body]


def _processes(tl: Timeline) -> str:
    if not tl.processes:
        return ""
    rows = "".join(
        f"<tr><td>{p.pid}</td><td>{p.ppid}</td><td class=\"l\">{esc(p.role)}</td>"
        f"<td class=\"wrap mono\">{esc(p.name)}</td><td>{esc(fmt_duration(p.first_t - tl.t0))}</td>"
        f"<td>{esc(fmt_duration(p.last_t - tl.t0))}</td></tr>" for p in tl.processes[:500])
    more = (f"<p class=\"how\">…and {len(tl.processes) - 500} more.</p>"
            if len(tl.processes) > 500 else "")
    return ("<h3>Processes observed</h3><table><thead><tr><th>pid</th><th>parent</th>"
            "<th class=\"l\">role</th><th class=\"l\">name</th><th>first seen</th>"
            f"<th>last seen</th></tr></thead><tbody>{rows}</tbody></table>{more}")


def _notes(tl: Timeline) -> str:
    if not tl.notes:
        return ""
    items = "".join(f"<li><b>{esc(src)}</b>: {esc(text)}</li>" for _, src, text in tl.notes)
    return f"<h3>Notes from the samplers</h3><ul>{items}</ul>"


# -- header --------------------------------------------------------------------------------------
def _train_rate(summary: Summary, phase: str) -> float | None:
    rows = [p for p in summary.get("phases") or [] if p.get("phase") == phase]
    images = sum(p.get("images") or 0 for p in rows)
    secs = sum(p.get("seconds") or 0.0 for p in rows)
    return images / secs if secs else None


def _header(summary: Summary, tl: Timeline | None, nav_links: Sequence[tuple[str, str]]
            ) -> str:
    run = summary.get("run") or {}
    started, ended = run.get("started"), run.get("ended")
    span = (ended - started) if started and ended else (tl.t1 - tl.t0 if tl else 0.0)
    # One definition of images/s everywhere (stated under the throughput chart).
    cards = [(fmt_num(_train_rate(summary, "train")), "training images / s (all epochs)"),
             (fmt_num(_train_rate(summary, "val")), "validation images / s (all epochs)"),
             (fmt_duration(span), "wall time"),
             (fmt_bytes((summary.get("memory") or {}).get("total_bytes")), "memory in use "
              f"({(summary.get('memory') or {}).get('device') or '?'})"),
             (fmt_pct(summary.get("monitor_overhead_frac")), "cost of monitoring")]
    card_html = "".join(f'<div class="card"><b>{esc(v)}</b><span>{esc(k)}</span></div>'
                        for v, k in cards)
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in nav_links)
    loader = summary.get("loader") or {}
    strategy = ""
    if loader.get("distribute_strategy"):  # watch read the Keras model's tf.distribute strategy
        replicas = loader.get("distribute_replicas")
        strategy = (f" · tf.distribute {loader['distribute_strategy']}"
                    + ("" if replicas is None else
                       f", {replicas} replica{'' if replicas == 1 else 's'}"))
    return (f"<h1>Run {esc(run.get('name') or (tl.run_name if tl else '?'))}</h1>"
            f"<p class=\"sub\">{esc(run.get('status') or '?')} · device "
            f"{esc(run.get('device') or '?')}{esc(strategy)} · started {esc(_when(started))} · command "
            f"<code>{esc(run.get('command') or '')}</code></p>"
            f"<nav>{nav}</nav><div class=\"cards\">{card_html}</div>")


# -- the sections, registered once: the page's order, its anchors and the nav come from here ------
@dataclass(frozen=True)
class ReportInput:
    """Everything a section may show."""

    summary: Summary
    timeline: Timeline
    answers: Sequence[AnswerLike]
    # free-form: the run's configuration as recorded
    config: dict[str, Any]


@dataclass(frozen=True)
class Section:
    """One section of the report: its anchor, its nav label (None: not in the nav), and what
    builds its title and body (None when the run recorded nothing for it)."""

    anchor: str
    nav: str | None
    build: Callable[[ReportInput], Body | None]


def _phases(r: ReportInput) -> Body:
    return "Epochs and phases", [_phase_table(r.summary)]


def _steps(r: ReportInput) -> Body:
    return "Where step time goes", [
        _step_time_chart(r.timeline), "<h3>Per epoch and phase</h3>",
        _phase_breakdown(r.summary, r.timeline), "<h3>Throughput per epoch</h3>",
        _throughput(r.summary)]


def _processes_and_notes(r: ReportInput) -> Body:
    return "Processes and notes", [_processes(r.timeline), _notes(r.timeline)]


# To add a section: write its builder above and register it here, nowhere else.
SECTIONS: tuple[Section, ...] = (
    Section("phases", "Phases", _phases),
    Section("ranks", "Ranks", lambda r: ranks_section(r.summary)),
    Section("findings", "Findings", lambda r: _findings(r.summary)),
    Section("explain", "Why", lambda r: _explanation(r.answers)),
    Section("steps", "Steps", _steps),
    Section("input", "Input", lambda r: ("Input pipeline", input_section_parts(r.summary))),
    Section("cpu", "CPU", lambda r: _cpu_section(r.timeline)),
    Section("gpu", "GPU", lambda r: _gpu_section(r.timeline)),
    Section("disk", "Disk", lambda r: _disk_section(r.timeline)),
    Section("memory", "Memory", lambda r: _memory_section(r.timeline)),
    Section("series", "More", lambda r: _more_series(r.timeline)),
    Section("ledger", "Ledger", lambda r: _ledger(r.summary)),
    Section("processes", None, _processes_and_notes),
    Section("config", "Configuration", lambda r: _config(r.config)),
)


# -- public API ------------------------------------------------------------------------------------
def render_report(summary: Summary, timeline: Timeline, answers: Sequence[AnswerLike],
                  config: dict[str, Any]) -> str:
    """The report as one HTML string (see :func:`write_report`)."""
    inp = ReportInput(summary, timeline, answers, config)
    built = [(s, b) for s in SECTIONS if (b := s.build(inp)) is not None]
    nav = [(s.anchor, s.nav) for s, _ in built if s.nav]
    html = [_header(summary, timeline, nav)]
    html += [section(s.anchor, title, *parts) for s, (title, parts) in built]
    return page(f"stepscope · {(summary.get('run') or {}).get('name') or timeline.run_name}",
                html)


def write_report(path: Path, summary: Summary, timeline: Timeline,
                 answers: Sequence[AnswerLike], config: dict[str, Any]) -> Path:
    """Write ``run_dir/report.html``: one self-contained file that opens offline.

    Args:
        path: where the report goes (the cli passes ``RunDir(run_dir).report``).
        summary: the ``summary.json`` dict (DESIGN.md schema 1).
        timeline: the run's bucketed history (``analysis.timeline.load_timeline``).
        answers: explanation answers (objects with ``title`` and ``text``).
        config: the run's resolved configuration, shown as a table.

    Returns:
        The path of the written report.

    Examples:
        >>> with RunReader(run_dir) as r:
        ...     path = write_report(RunDir(run_dir).report, summary, load_timeline(r), explain(summary), cfg)
    """
    return atomic_write_text(Path(path), render_report(summary, timeline, answers, config))
