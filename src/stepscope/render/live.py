"""`stepscope top`: one frame of a live run, as a rich renderable."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stepscope.analysis.fmt import fmt_bytes, fmt_bytes_per_s, fmt_pct, fmt_pct_value, fmt_rate
from stepscope.analysis.live import LiveSnapshot


def top_view(s: LiveSnapshot) -> RenderableType:
    """Header (run, status, phase), the step split of the last steps, machine and processes."""
    age = "" if s.age_s is None else f", last write {s.age_s:.0f}s ago"
    where = "no phase yet" if s.phase is None else (
        f"epoch {s.epoch} {s.phase}: {s.phase_steps} steps, {s.phase_images} images")
    head = Text(f"{s.name} — {s.status}{age} — {where}")
    split = Table(title="last steps", show_edge=False)
    for col in ("img/s", "data wait", "copy", "compute"):
        split.add_column(col, justify="right")
    split.add_row(fmt_rate(s.images_per_s),
                  fmt_pct(s.data_wait_frac), fmt_pct(s.transfer_frac), fmt_pct(s.compute_frac))
    machine = Table(title="machine (latest samples)", show_edge=False)
    machine.add_column("what")
    machine.add_column("value", justify="right")
    lat = s.latest
    rows = [
        ("CPU (mean of cores)", fmt_pct_value(lat.get("host/cpu_util_pct"))),
        ("GPU utilization (NVML)", fmt_pct_value(lat.get("gpu0/util_pct"))),
        ("disk reads (physical)", fmt_bytes_per_s(lat.get("tree/read_rate_bytes_per_s"))),
        ("reads served by page cache", fmt_bytes_per_s(lat.get("tree/cache_read_rate_bytes_per_s"))),
        ("dataset in page cache", fmt_pct(lat.get("pagecache/dataset_resident_frac"))),
        ("memory available", fmt_bytes(lat.get("host/mem_available_bytes"))),
    ]
    for what, value in rows:
        machine.add_row(what, value)
    procs = Table(title="processes", show_edge=False)
    for col in ("pid", "role", "CPU", "RSS"):
        procs.add_column(col, justify="right" if col != "role" else "left")
    for pid, role, cpu, rss in s.processes:
        procs.add_row(str(pid), role, fmt_pct_value(cpu), fmt_bytes(rss))
    return Group(head, split, machine, procs)


