"""Everything a report plots over time, bounded in size whatever the run's length.

A 24-hour run sampled at 1 Hz holds ~86,400 samples per metric, and a long run can hold a
million steps; nobody can see more points than a plot has pixels, and a report must stay small.
So every series is cut into at most ``max_points`` equal time buckets, and each bucket keeps its
minimum, maximum and mean: a one-second spike survives as the bucket's maximum instead of being
averaged away. The aggregation runs inside the store (``GROUP BY bucket`` with ``MIN``/``MAX``, over
raw rows and roll-ups together), so Python only sees the bucketed rows.

All series share one bucket grid (``t0`` + ``bucket_s`` x index), so series can be added bucket
by bucket (e.g. the CPU of all DataLoader workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepscope.store.db import RunReader
from stepscope.store.records import ProcessInfo

DEFAULT_MAX_POINTS = 1500
# Individual steps kept for the Chrome trace; beyond this, consecutive steps are merged.
DEFAULT_MAX_STEP_SPANS = 20_000


@dataclass(frozen=True)
class Series:
    """One sampled metric of one source, bucketed. ``lo``/``hi``/``mean`` are per bucket."""

    source: str
    metric: str
    bucket: list[int]
    t: list[float]
    lo: list[float]
    hi: list[float]
    mean: list[float]
    n_samples: int

    @property
    def downsampled(self) -> bool:
        return self.n_samples > len(self.bucket)


@dataclass(frozen=True)
class PhaseBand:
    """One epoch x phase as a time interval (``ended`` is the run's end for an unfinished one)."""

    phase_id: int
    epoch: int
    phase: str
    started: float
    ended: float
    rank: int = 0


@dataclass(frozen=True)
class StepSeries:
    """Per-step timings, bucketed on the shared grid by the step's start time. Component
    means add up to ``wall_mean`` because every step's parts add up to its wall time."""

    bucket: list[int] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    wall_mean: list[float] = field(default_factory=list)
    wall_max: list[float] = field(default_factory=list)
    data_wait_mean: list[float] = field(default_factory=list)
    data_wait_max: list[float] = field(default_factory=list)
    transfer_mean: list[float] = field(default_factory=list)
    compute_mean: list[float] = field(default_factory=list)
    other_mean: list[float] = field(default_factory=list)
    n_steps: int = 0


@dataclass(frozen=True)
class PhaseSteps:
    """Sums of step parts over one phase's steady-state (non-warm-up) steps."""

    phase_id: int
    epoch: int
    phase: str
    steps: int
    images: int
    wall_s: float
    data_wait_s: float
    transfer_s: float
    compute_s: float
    other_s: float


@dataclass(frozen=True)
class StepSpan:
    """One step, or (``count`` > 1) consecutive steps of one phase merged, with summed parts."""

    phase_id: int
    first_step: int
    last_step: int
    count: int
    t_start: float
    t_end: float
    data_wait_s: float
    transfer_s: float
    compute_s: float
    other_s: float
    images: int
    warmup: bool


@dataclass(frozen=True)
class Timeline:
    """A run's plottable history. Times are Unix seconds; ``t0`` is where plots start.

    Examples:
        >>> tl = load_timeline(RunReader(Path("runs/demo")))
        >>> cpu = tl.get("host", "cpu_util_pct")
        >>> len(cpu.t) <= tl.max_points
        True
    """

    run_name: str
    status: str
    t0: float
    t1: float
    bucket_s: float
    max_points: int
    series: dict[tuple[str, str], Series]
    phases: list[PhaseBand]
    steps: StepSeries
    phase_steps: list[PhaseSteps]
    step_spans: list[StepSpan]
    spans_aggregated: bool
    processes: list[ProcessInfo]
    notes: list[tuple[float, str, str]]

    def get(self, source: str, metric: str) -> Series | None:
        return self.series.get((source, metric))

    def sources(self, metric: str, prefix: str = "") -> list[str]:
        """Sources that recorded ``metric`` (optionally only those starting with ``prefix``)."""
        return sorted(s for s, m in self.series if m == metric and s.startswith(prefix))


def _time_range(reader: RunReader) -> tuple[float, float]:
    """The run's extent: from the earliest of start/sample/phase to the latest of them."""
    run = reader.run()
    s0, s1, p0, p1, q1 = reader.aggregates.extent()
    starts = [v for v in (run.started or None, s0, p0) if v is not None]
    ends = [v for v in (run.ended, reader.heartbeat(), s1, p1, q1) if v is not None]
    t0 = min(starts) if starts else 0.0
    t1 = max(ends) if ends else t0
    return t0, max(t1, t0)


def load_series(
    reader: RunReader, t0: float, bucket_s: float, max_points: int
) -> dict[tuple[str, str], Series]:
    """Every (source, metric) bucketed on the grid ``t0 + k * bucket_s``, k < ``max_points``."""
    acc: dict[tuple[str, str], tuple[list[Any], ...]] = {}
    for source, metric, b, t, lo, hi, mean, n in reader.aggregates.sample_buckets(
            t0, bucket_s, max_points):
        cols = acc.setdefault((source, metric), ([], [], [], [], [], [0]))
        for col, v in zip(cols[:5], (b, t, lo, hi, mean), strict=True):
            col.append(v)
        cols[5][0] += n
    return {
        key: Series(key[0], key[1], c[0], c[1], c[2], c[3], c[4], c[5][0])
        for key, c in acc.items()
    }


def load_step_series(
    reader: RunReader, t0: float, bucket_s: float, max_points: int
) -> StepSeries:
    """Per-step timings bucketed by start time: means of each part, maxima of wall and wait."""
    rows = reader.aggregates.step_buckets(t0, bucket_s, max_points)
    if not rows:
        return StepSeries()
    cols = list(zip(*rows, strict=True))
    return StepSeries(
        bucket=list(cols[0]), t=list(cols[1]), steps=list(cols[2]),
        images=[int(v or 0) for v in cols[3]], wall_mean=list(cols[4]), wall_max=list(cols[5]),
        data_wait_mean=list(cols[6]), data_wait_max=list(cols[7]), transfer_mean=list(cols[8]),
        compute_mean=list(cols[9]), other_mean=list(cols[10]), n_steps=sum(cols[2]),
    )


def load_phase_steps(reader: RunReader) -> list[PhaseSteps]:
    """Per-phase sums of the step parts over steady-state steps (warm-up left out)."""
    steady = {t.phase_id: t for t in reader.aggregates.step_totals() if not t.warmup}
    out = []
    for p in reader.phases():
        t = steady.get(p.phase_id)
        out.append(PhaseSteps(p.phase_id, p.epoch, p.phase, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
                   if t is None else
                   PhaseSteps(p.phase_id, p.epoch, p.phase, t.steps, t.images, t.wall_s,
                              t.data_wait_s, t.transfer_s, t.compute_s + t.comm_s, t.other_s))
    return out


def load_step_spans(reader: RunReader, max_spans: int) -> tuple[list[StepSpan], bool]:
    """Every step when there are at most ``max_spans``; else consecutive steps merged per phase
    into about ``max_spans`` spans. Returns the spans and whether any were merged."""
    rows, merged = reader.aggregates.step_spans(max_spans)
    spans = [
        StepSpan(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], int(r[10] or 0),
                 bool(r[11]))
        for r in rows
    ]
    return spans, merged


def load_timeline(
    reader: RunReader,
    max_points: int = DEFAULT_MAX_POINTS,
    max_step_spans: int = DEFAULT_MAX_STEP_SPANS,
) -> Timeline:
    """Load a run's bounded, plottable history.

    Args:
        reader: an open run database.
        max_points: the most buckets any series (samples or steps) is cut into.
        max_step_spans: the most individual steps kept for traces before merging.

    Returns:
        The timeline; its size depends on ``max_points``, not on the run's length.

    Examples:
        >>> with RunReader(Path("runs/demo")) as r:
        ...     tl = load_timeline(r, max_points=500)
    """
    max_points = max(1, int(max_points))
    t0, t1 = _time_range(reader)
    bucket_s = (t1 - t0) / max_points if t1 > t0 else 1.0
    run = reader.run()
    phases = [
        PhaseBand(p.phase_id, p.epoch, p.phase, p.started,
                  p.ended if p.ended is not None else t1, p.rank)
        for p in reader.phases()
    ]
    spans, merged = load_step_spans(reader, max_step_spans)
    processes = reader.processes()
    return Timeline(
        run_name=run.name, status=run.status, t0=t0, t1=t1, bucket_s=bucket_s,
        max_points=max_points, series=load_series(reader, t0, bucket_s, max_points),
        phases=phases, steps=load_step_series(reader, t0, bucket_s, max_points),
        phase_steps=load_phase_steps(reader), step_spans=spans, spans_aggregated=merged,
        processes=processes, notes=[(n.t, n.source, n.text) for n in reader.notes()],
    )


def sum_series(series: list[Series], source: str, metric: str) -> Series | None:
    """Add series bucket by bucket (e.g. all workers' CPU); a bucket missing in one counts 0.

    Per-bucket minima and maxima are summed too, which bounds the true range of the sum.
    """
    if not series:
        return None
    acc: dict[int, list[float]] = {}
    for s in series:
        for b, t, lo, hi, mean in zip(s.bucket, s.t, s.lo, s.hi, s.mean, strict=True):
            row = acc.setdefault(b, [0.0, 0.0, 0.0, 0.0, 0.0])
            row[0] += t
            row[1] += 1
            row[2] += lo
            row[3] += hi
            row[4] += mean
    keys = sorted(acc)
    return Series(
        source, metric, keys, [acc[b][0] / acc[b][1] for b in keys], [acc[b][2] for b in keys],
        [acc[b][3] for b in keys], [acc[b][4] for b in keys], sum(s.n_samples for s in series),
    )
