"""Inline SVG charts for the HTML report: time lines with phase bands, heat maps, bars, waterfall.

Plain strings, no JavaScript and no third-party library, so a report opens offline in any
browser and keeps working in ten years. Every text that reaches the SVG goes through
:func:`esc`. Sizes stay bounded because the callers pass already-bucketed series (at most a
few thousand points each).
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.analysis.fmt import fmt_pct_value

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
           "#9c755f", "#ff9da7", "#bab0ac")
PHASE_FILL = {"train": "#e3edf9", "val": "#fde6cc"}
WIDTH = 1080
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 22, 40


def esc(value: object) -> str:
    """Text made safe for HTML and SVG (also inside attribute values)."""
    return html.escape(str(value), quote=True)


def fmt_axis(v: float, unit: str) -> str:
    """A tick label: ``pct`` → ``45 %``, ``bytes`` → ``1.5 GB``, ``bytes_per_s`` → ``12 MB/s``,
    ``ms`` → ``120 ms``; anything else prints the number and the unit."""
    if unit == "pct":
        return fmt_pct_value(v)
    if unit in ("bytes", "bytes_per_s"):
        suffix = "/s" if unit == "bytes_per_s" else ""
        for name in ("B", "kB", "MB", "GB", "TB"):
            if abs(v) < 1000 or name == "TB":
                return f"{v:.3g} {name}{suffix}"
            v /= 1000
    if unit == "ms":
        return f"{v:.3g} ms"
    return f"{v:.3g} {unit}".strip()


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of 10)."""
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _time_unit(span_s: float) -> tuple[float, str]:
    if span_s <= 180:
        return 1.0, "s"
    if span_s <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


@dataclass
class Line:
    """A series to draw: times, mean values, and optionally the per-bucket min and max."""

    label: str
    t: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    color: str = PALETTE[0]
    width: float = 1.5
    fill: bool = False  # draw as a filled area down to the previous stacked line


@dataclass
class Band:
    """A shaded time interval (an epoch's train or val phase)."""

    start: float
    end: float
    kind: str
    label: str


class _Frame:
    """Maps (time, value) to pixels for one chart."""

    def __init__(self, t0: float, t1: float, y0: float, y1: float, height: int) -> None:
        self.t0, self.t1 = t0, t1 if t1 > t0 else t0 + 1.0
        self.y0, self.y1 = y0, y1 if y1 > y0 else y0 + 1.0
        self.height = height
        self.pw = WIDTH - LEFT - RIGHT
        self.ph = height - TOP - BOTTOM

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / (self.t1 - self.t0) * self.pw

    def y(self, v: float) -> float:
        v = min(max(v, self.y0), self.y1)
        return TOP + self.ph - (v - self.y0) / (self.y1 - self.y0) * self.ph


def _points(f: _Frame, t: Sequence[float], y: Sequence[float]) -> str:
    return " ".join(f"{f.x(a):.1f},{f.y(b):.1f}" for a, b in zip(t, y, strict=True))


def _bands_svg(f: _Frame, bands: Sequence[Band]) -> list[str]:
    out = []
    for b in bands:
        x0, x1 = f.x(max(b.start, f.t0)), f.x(min(b.end, f.t1))
        if x1 <= x0:
            continue
        out.append(f'<rect x="{x0:.1f}" y="{TOP}" width="{x1 - x0:.1f}" height="{f.ph}" '
                   f'fill="{PHASE_FILL.get(b.kind, "#eee")}"><title>{esc(b.label)}</title></rect>')
        if x1 - x0 >= 22 and b.kind == "train":
            out.append(f'<text x="{x0 + 3:.1f}" y="{TOP - 6}" class="band">{esc(b.label)}</text>')
    return out


def _y_axis_svg(f: _Frame, unit: str, y_label: str) -> list[str]:
    out = []
    for v in nice_ticks(f.y0, f.y1):
        y = f.y(v)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   'class="grid"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                   f"{esc(fmt_axis(v, unit))}</text>")
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + f.ph}" y2="{TOP + f.ph}" '
               'class="axis"/>')
    out.append(f'<text transform="translate(14,{TOP + f.ph / 2:.0f}) rotate(-90)" class="label" '
               f'text-anchor="middle">{esc(y_label)}</text>')
    return out


def _time_axis_svg(f: _Frame) -> list[str]:
    out = []
    scale, name = _time_unit(f.t1 - f.t0)
    for v in nice_ticks(0.0, (f.t1 - f.t0) / scale, 8):
        x = f.x(f.t0 + v * scale)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + f.ph}" y2="{TOP + f.ph + 4}" '
                   'class="axis"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + f.ph + 16}" class="tick" '
                   f'text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{LEFT + f.pw / 2:.0f}" y="{f.height - 4}" class="label" '
               f'text-anchor="middle">time since start ({name})</text>')
    return out


def _y_range(lines: Sequence[Line], y_max: float | None) -> tuple[float, float]:
    if y_max is not None:
        return 0.0, y_max
    top = max((max(ln.hi or ln.y, default=0.0) for ln in lines), default=0.0)
    top = top if top > 0 else 1.0
    ticks = nice_ticks(0.0, top * 1.05)
    return 0.0, max(ticks[-1], top * 1.05) if len(ticks) > 1 else top * 1.05


def _segments(t: Sequence[float], gap_s: float | None) -> list[tuple[int, int]]:
    """Index ranges [i, j) with no time gap wider than ``gap_s`` (e.g. between phases), so a
    line is not drawn across a stretch with no data."""
    if gap_s is None or len(t) < 2:
        return [(0, len(t))]
    cuts = [i for i in range(1, len(t)) if t[i] - t[i - 1] > gap_s]
    edges = [0, *cuts, len(t)]
    return list(itertools.pairwise(edges))


def time_chart(lines: Sequence[Line], bands: Sequence[Band], t0: float, t1: float, *,
               unit: str, y_label: str, y_max: float | None = None, height: int = 230,
               title: str = "", gap_s: float | None = None) -> str:
    """A time chart: phase bands behind, min–max envelopes (light) and mean lines on top.

    Lines with ``fill=True`` are drawn as areas stacked in the order given (their ``y`` must
    already be cumulative); the area of each runs down to the previous filled line. Lines break
    where consecutive points are more than ``gap_s`` apart.
    """
    f = _Frame(t0, t1, *_y_range(lines, y_max), height)
    out = [f'<svg viewBox="0 0 {WIDTH} {height}" class="chart" role="img" '
           f'aria-label="{esc(title or y_label)}">']
    out += _bands_svg(f, bands)
    out += _y_axis_svg(f, unit, y_label) + _time_axis_svg(f)
    base: Line | None = None
    for ln in lines:
        for i, j in _segments(ln.t, max(gap_s, 3 * _median_dt(ln.t)) if gap_s else None):
            out += _draw(f, _slice(ln, i, j), _slice(base, i, j) if base else None)
        base = ln if ln.fill else base
    out.append("</svg>")
    return "".join(out)


def _median_dt(t: Sequence[float]) -> float:
    if len(t) < 2:
        return 0.0
    gaps = sorted(b - a for a, b in itertools.pairwise(t))
    return gaps[len(gaps) // 2]


def _slice(ln: Line, i: int, j: int) -> Line:
    return Line(ln.label, ln.t[i:j], ln.y[i:j], ln.lo[i:j] if ln.lo is not None else None,
                ln.hi[i:j] if ln.hi is not None else None, ln.color, ln.width, ln.fill)


def _draw(f: _Frame, ln: Line, base: Line | None) -> list[str]:
    if not ln.t:
        return []
    if ln.fill:
        return [_area(f, ln, base)]
    out = []
    if ln.lo is not None and ln.hi is not None and any(
            h - lo_ > 1e-12 for lo_, h in zip(ln.lo, ln.hi, strict=True)):
        pts = _points(f, ln.t, ln.hi) + " " + _points(f, ln.t[::-1], ln.lo[::-1])
        out.append(f'<polygon points="{pts}" fill="{ln.color}" fill-opacity="0.18" '
                   'stroke="none"/>')
    out.append(f'<polyline points="{_points(f, ln.t, ln.y)}" fill="none" '
               f'stroke="{ln.color}" stroke-width="{ln.width}" stroke-linejoin="round">'
               f"<title>{esc(ln.label)}</title></polyline>")
    return out


def _area(f: _Frame, ln: Line, base: Line | None) -> str:
    lower = base.y if base is not None and len(base.y) == len(ln.y) else [0.0] * len(ln.y)
    pts = _points(f, ln.t, ln.y) + " " + _points(f, ln.t[::-1], list(lower)[::-1])
    return (f'<polygon points="{pts}" fill="{ln.color}" fill-opacity="0.85" stroke="none">'
            f"<title>{esc(ln.label)}</title></polygon>")


def heat_color(frac: float) -> str:
    """White (idle) through orange to dark red (saturated)."""
    frac = min(max(frac, 0.0), 1.0)
    r = 255 - int(frac * 80)
    g = 255 - int(frac * 215)
    b = 255 - int(frac * 235)
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(rows: Sequence[tuple[str, Sequence[float], Sequence[float]]], t0: float, t1: float, *,
            max_value: float = 100.0, columns: int = 240, y_label: str = "") -> str:
    """One row per label (e.g. per CPU core) of (times, values), coloured by value/max_value.

    Values are averaged into ``columns`` time cells, and runs of cells with the same colour
    level are merged into one rectangle, which keeps a long run's map small.
    """
    row_h = max(6, min(18, 220 // max(1, len(rows))))
    height = TOP + BOTTOM + row_h * len(rows)
    f = _Frame(t0, t1, 0.0, 1.0, height)
    out = [f'<svg viewBox="0 0 {WIDTH} {height}" class="chart" role="img" '
           f'aria-label="{esc(y_label)}">']
    for i, (label, ts, vs) in enumerate(rows):
        y = TOP + i * row_h
        levels = _cells(ts, vs, t0, t1, columns, max_value)
        out += _row_rects(levels, y, row_h, f.pw / columns)
        if row_h >= 9:
            out.append(f'<text x="{LEFT - 6}" y="{y + row_h - 2}" class="tick" '
                       f'text-anchor="end">{esc(label)}</text>')
    out += _time_axis_svg(f)
    out.append("</svg>")
    return "".join(out)


def _cells(ts: Sequence[float], vs: Sequence[float], t0: float, t1: float, columns: int,
           max_value: float) -> list[int | None]:
    """Each column's mean value as a colour level 0..10 (None: no samples there)."""
    sums = [0.0] * columns
    counts = [0] * columns
    span = (t1 - t0) or 1.0
    for t, v in zip(ts, vs, strict=True):
        c = min(columns - 1, max(0, int((t - t0) / span * columns)))
        sums[c] += v
        counts[c] += 1
    return [None if n == 0 else round(10 * min(1.0, s / n / max_value))
            for s, n in zip(sums, counts, strict=True)]


def _row_rects(levels: list[int | None], y: float, h: int, cell_w: float) -> list[str]:
    out = []
    i = 0
    while i < len(levels):
        j = i
        while j + 1 < len(levels) and levels[j + 1] == levels[i]:
            j += 1
        if levels[i] is not None:
            out.append(f'<rect x="{LEFT + i * cell_w:.1f}" y="{y}" width="{(j - i + 1) * cell_w:.1f}"'
                       f' height="{h - 1}" fill="{heat_color((levels[i] or 0) / 10)}"/>')
        i = j + 1
    return out


@dataclass
class Bar:
    """One bar segment: its label (legend), value and colour."""

    label: str
    value: float
    color: str
    note: str = ""


def bar_chart(groups: Sequence[tuple[str, Sequence[Bar]]], *, unit: str, y_label: str,
              stacked: bool, height: int = 240) -> str:
    """Bars per group (an epoch, a phase): side by side, or stacked segments."""
    totals = [sum(b.value for b in bars) if stacked else max((b.value for b in bars), default=0)
              for _, bars in groups]
    top = max(totals, default=0.0) or 1.0
    ticks = nice_ticks(0.0, top * 1.08)
    f = _Frame(0.0, 1.0, 0.0, max(ticks[-1], top * 1.08), height)
    out = [f'<svg viewBox="0 0 {WIDTH} {height}" class="chart" role="img" '
           f'aria-label="{esc(y_label)}">']
    out += _y_axis_svg(f, unit, y_label)
    slot = f.pw / max(1, len(groups))
    # Many groups: label every k-th one so the labels do not run into each other.
    every = max(1, math.ceil(max((len(g[0]) for g in groups), default=1) * 6.5 / slot))
    for gi, (label, bars) in enumerate(groups):
        x0 = LEFT + gi * slot + slot * 0.12
        inner = slot * 0.76
        out += _group_bars(f, bars, x0, inner, unit, stacked)
        if gi % every:
            continue
        out.append(f'<text x="{LEFT + (gi + 0.5) * slot:.1f}" y="{TOP + f.ph + 16}" class="tick" '
                   f'text-anchor="middle">{esc(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def _group_bars(f: _Frame, bars: Sequence[Bar], x0: float, inner: float, unit: str,
                stacked: bool) -> list[str]:
    out = []
    acc = 0.0
    w = inner if stacked else inner / max(1, len(bars))
    for i, b in enumerate(bars):
        lo, hi = (acc, acc + b.value) if stacked else (0.0, b.value)
        x = x0 if stacked else x0 + i * w
        y_top, y_bot = f.y(hi), f.y(lo)
        tip = f"{b.label}: {fmt_axis(b.value, unit)}" + (f" ({b.note})" if b.note else "")
        out.append(f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{max(w - 1, 1):.1f}" '
                   f'height="{max(y_bot - y_top, 0):.1f}" fill="{b.color}"><title>{esc(tip)}'
                   "</title></rect>")
        if not stacked and w >= 34 and b.value > 0:
            out.append(f'<text x="{x + w / 2:.1f}" y="{y_top - 3:.1f}" class="val" '
                       f'text-anchor="middle">{esc(fmt_axis(b.value, unit))}</text>')
        acc += b.value if stacked else 0.0
    return out


def waterfall(items: Sequence[tuple[str, float, str]], total: float | None, *, unit: str,
              y_label: str, height: int = 260) -> str:
    """Items stacking up one after another to the total: (label, value, colour) each."""
    steps = [(label, v, c) for label, v, c in items if v]
    top = max(total or 0.0, sum(v for _, v, _ in steps)) or 1.0
    f = _Frame(0.0, 1.0, 0.0, top * 1.1, height)
    out = [f'<svg viewBox="0 0 {WIDTH} {height}" class="chart" role="img" '
           f'aria-label="{esc(y_label)}">']
    out += _y_axis_svg(f, unit, y_label)
    cols = [*steps, ("total", total if total is not None else sum(v for _, v, _ in steps),
                     "#555")]
    slot = f.pw / len(cols)
    acc = 0.0
    for i, (label, v, color) in enumerate(cols):
        lo, hi = (0.0, v) if i == len(cols) - 1 else (acc, acc + v)
        acc += v if i < len(cols) - 1 else 0.0
        x = LEFT + i * slot + slot * 0.15
        y_top, y_bot = f.y(hi), f.y(lo)
        out.append(f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{slot * 0.7:.1f}" '
                   f'height="{max(y_bot - y_top, 1):.1f}" fill="{color}"><title>'
                   f"{esc(label)}: {esc(fmt_axis(v, unit))}</title></rect>")
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{y_top - 4:.1f}" class="val" '
                   f'text-anchor="middle">{esc(fmt_axis(v, unit))}</text>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{TOP + f.ph + 16}" class="tick" '
                   f'text-anchor="middle">{esc(_short(label, slot))}</text>')
    out.append("</svg>")
    return "".join(out)


def _short(label: str, slot_px: float) -> str:
    room = max(4, int(slot_px / 6.5))
    return label if len(label) <= room else label[: room - 1] + "…"


def legend(entries: Sequence[tuple[str, str, str]]) -> str:
    """An HTML legend: (label, colour, kind) with kind ``line``, ``box`` or ``band``."""
    items = []
    for label, color, kind in entries:
        items.append(f'<span class="key"><i class="sw {esc(kind)}" style="background:{esc(color)}">'
                     f"</i>{esc(label)}</span>")
    return f'<div class="legend">{"".join(items)}</div>'
