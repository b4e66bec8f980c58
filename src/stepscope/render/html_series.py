"""The report's charts of sampled series, taken from the metrics registry.

``stepscope.metrics`` says which series are charted, in which section and chart, under which
label (:class:`stepscope.metrics.Chart`); this module draws every one of them that the run
recorded. A new sampler's series therefore reaches the report by its registry entry alone; the
prose below (what a chart shows, how it is drawn) is optional, and a chart without any gets the
registry's meanings as its note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stepscope import metrics
from stepscope.analysis.timeline import Timeline
from stepscope.render.html_page import empty, how
from stepscope.render.svg import PALETTE, Line, esc

# registry unit -> (axis unit, scale, y_max): shares are drawn 0-100 %
_AXES: dict[str, tuple[str, float, float | None]] = {
    "%": ("pct", 1.0, 100.0), "0-1": ("pct", 100.0, 100.0),
    "B": ("bytes", 1.0, None), "B/s": ("bytes_per_s", 1.0, None)}


@dataclass(frozen=True)
class Look:
    """How the report draws one chart and what it says under it (all optional)."""

    how: str = ""
    head: str = ""  # a sub-heading above the chart
    empty: str = ""  # said in place of the chart when the run recorded none of its series
    width: float = 1.5
    colors: tuple[int, ...] = ()  # PALETTE indices, in turn (default 0, 1, 2, …)
    height: int = 230


@dataclass
class SeriesChart:
    """One chart's lines, ready to draw."""

    title: str
    unit: str
    y_max: float | None
    lines: list[Line]
    look: Look
    meanings: list[str]

    def note(self) -> str:
        """The text under the chart: its look's prose, else what its series mean."""
        return self.look.how or "; ".join(dict.fromkeys(self.meanings)) + "."


def section_names() -> list[str]:
    """Every report section the registry charts into, in registry order."""
    return list(dict.fromkeys(m.chart.section for m in metrics.METRICS if m.chart))


def series_charts(tl: Timeline, section: str,
                  looks: dict[tuple[str, str], Look]) -> list[SeriesChart]:
    """The section's charts in registry order, each with the lines of the series recorded."""
    # In the order CHARTS lists them (a chart's lines read in that order), then the rest.
    rank = {key: i for i, key in enumerate(metrics.CHARTS)}
    entries = sorted((m for m in metrics.METRICS if m.chart and m.chart.section == section),
                     key=lambda m: rank.get((m.source, m.metric), len(rank)))
    out: list[SeriesChart] = []
    for title in dict.fromkeys(m.chart.title for m in entries if m.chart):
        mine = [m for m in entries if m.chart and m.chart.title == title]
        axis, scale, y_max = _AXES.get(mine[0].unit, (mine[0].unit, 1.0, None))
        look = looks.get((section, title), Look())
        chart = SeriesChart(title, axis, y_max, [], look, [m.meaning for m in mine])
        # Series of one order are drawn source by source (cuda0 reserved, allocated, cuda1 …).
        for order in sorted({m.chart.order for m in mine if m.chart}):
            group = [m for m in mine if m.chart and m.chart.order == order]
            found = {m: dict(metrics.chart_sources(m, tl.sources(m.metric))) for m in group}
            for source in sorted({s for labels in found.values() for s in labels}):
                for m in group:
                    s = tl.get(source, m.metric)
                    if s is None or source not in found[m]:
                        continue
                    i = len(chart.lines)
                    color = PALETTE[(look.colors[i % len(look.colors)] if look.colors else i)
                                    % len(PALETTE)]
                    chart.lines.append(Line(found[m][source], s.t, [v * scale for v in s.mean],
                                            [v * scale for v in s.lo],
                                            [v * scale for v in s.hi], color, look.width))
        out.append(chart)
    return out


def chart_parts(charts: list[SeriesChart], draw: Callable[[SeriesChart], str]) -> list[str]:
    """HTML for the charts that have lines (and the empty note of those that have one); none
    when no chart has a line, so the section can say so once."""
    parts: list[str] = []
    if not any(c.lines for c in charts):
        return parts
    for c in charts:
        if not c.lines:
            if c.look.empty:
                parts.append(empty(c.look.empty))
            continue
        parts.append((f"<h3>{esc(c.look.head)}</h3>" if c.look.head else "") + draw(c)
                     + how(c.note()))
    return parts
