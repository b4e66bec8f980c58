"""What `stepscope top` shows: a snapshot of a run that may still be running (pure: reads the store)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stepscope.store.db import RunReader

RECENT_STEPS = 50


@dataclass
class LiveSnapshot:
    """The newest state of a run: its current phase, the last steps' split, the latest samples."""

    name: str
    status: str
    age_s: float | None  # seconds since the writer's last commit (heartbeat)
    epoch: int | None = None
    phase: str | None = None
    phase_steps: int = 0
    phase_images: int = 0
    images_per_s: float | None = None
    data_wait_frac: float | None = None
    transfer_frac: float | None = None
    compute_frac: float | None = None
    latest: dict[str, float] = field(default_factory=dict)  # "source/metric" -> value
    processes: list[tuple[int, str, float | None, float | None]] = field(default_factory=list)


def snapshot(reader: RunReader, now: float | None = None) -> LiveSnapshot:
    """Read the newest phase, the last steps and the latest value of every series."""
    info = reader.run()
    now = time.time() if now is None else now
    beat = reader.heartbeat()
    snap = LiveSnapshot(name=info.name, status=info.status,
                        age_s=None if beat is None else max(now - beat, 0.0))
    phases = reader.phases()
    if phases:
        cur = phases[-1]
        snap.epoch, snap.phase = cur.epoch, cur.phase
        done = reader.aggregates.step_totals(cur.phase_id)
        snap.phase_steps = sum(t.steps for t in done)
        snap.phase_images = sum(t.images for t in done)
        recent = reader.recent_steps(cur.phase_id, RECENT_STEPS)
        wall = sum(s.wall_s for s in recent)
        if wall > 0:
            snap.images_per_s = sum(s.images for s in recent) / wall
            snap.data_wait_frac = sum(s.data_wait_s for s in recent) / wall
            snap.transfer_frac = sum(s.transfer_s for s in recent) / wall
            snap.compute_frac = sum(s.compute_s for s in recent) / wall
    span = reader.time_range()
    if span is not None:
        # Only the last few sampling periods matter; the index on (metric, source, t) keeps
        # this cheap even on a day-long run.
        latest = reader.latest(span[1] - 10.0)
        snap.latest = {f"{src}/{metric}": v for (src, metric), v in latest.items()}
    for p in reader.processes():
        if p.last_t < (span[1] if span else 0) - 5.0:
            continue  # gone
        snap.processes.append((p.pid, p.role, snap.latest.get(f"proc:{p.pid}/cpu_util_pct"),
                               snap.latest.get(f"proc:{p.pid}/rss_bytes")))
    return snap
