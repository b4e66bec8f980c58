"""`stepscope top`: one frame of a live run, as a rich renderable."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.live import LiveSnapshot
from stepscope.render.terminal import fmt_bytes, fmt_pct


def _pct(frac: float | None) -> str:
    return "–" if frac is None else f"{frac * 100:.0f}%"


def top_view(s: LiveSnapshot) -> RenderableType:
    """Header (run, status, phase), the step split of the last steps, machine and processes."""
    age = "" if s.age_s is None else f", last write {s.age_s:.0f}s ago"
    where = "no phase yet" if s.phase is None else (
        f"epoch {s.epoch} {s.phase}: {s.phase_steps} steps, {s.phase_images} images")
    head = Text(f"{s.name} — {s.status}{age} — {where}")
    split = Table(title="last steps", show_edge=False)
    for col in ("img/s", "data wait", "copy", "compute"):
        split.add_column(col, justify="right")
    split.add_row("–" if s.images_per_s is None else f"{s.images_per_s:.1f}",
                  _pct(s.data_wait_frac), _pct(s.transfer_frac), _pct(s.compute_frac))
    machine = Table(title="machine (latest samples)", show_edge=False)
    machine.add_column("what")
    machine.add_column("value", justify="right")
    lat = s.latest
    rows = [
        ("CPU (mean of cores)", _of100(lat.get("host/cpu_util_pct"))),
        ("GPU utilization (NVML)", _of100(lat.get("gpu0/util_pct"))),
        ("disk reads (physical)", _rate(lat.get("tree/read_rate_bytes_per_s"))),
        ("reads served by page cache", _rate(lat.get("tree/cache_read_rate_bytes_per_s"))),
        ("dataset in page cache", _pct(lat.get("pagecache/dataset_resident_frac"))),
        ("memory available", fmt_bytes(lat.get("host/mem_available_bytes"))),
    ]
    for what, value in rows:
        machine.add_row(what, value)
    procs = Table(title="processes", show_edge=False)
    for col in ("pid", "role", "CPU", "RSS"):
        procs.add_column(col, justify="right" if col != "role" else "left")
    for pid, role, cpu, rss in s.processes:
        procs.add_row(str(pid), role, _of100(cpu), fmt_bytes(rss))
    return Group(head, split, machine, procs)


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{fmt_bytes(v)}/s"


def _of100(v: float | None) -> str:
    """A 0-100 percentage (100 = one core for a process)."""
    return fmt_pct(None if v is None else v / 100.0)
