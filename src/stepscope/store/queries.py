"""Read-side aggregates over raw rows and roll-ups together (see :mod:`stepscope.store.rollups`).

Each query reads raw rows not yet rolled up plus roll-up rows in one statement, so it counts
every step and sample once, whatever the run's length and even while the writer works. The
aggregation runs inside SQLite (``GROUP BY``), so Python only sees bucketed rows.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

from stepscope.store import rollups

# Which figure of a rolled-up slice a series reads: its mean, or its highest or lowest sample (a
# peak must read ``max``: the mean of a minute hides a spike inside it). A raw sample is all three.
Stat = Literal["mean", "max", "min"]
_STAT_SQL: dict[Stat, str] = {"mean": "total / n", "max": "hi", "min": "lo"}


@dataclass(frozen=True)
class SeriesRows:
    """One metric's points, oldest first. ``n[i]`` is how many samples stand behind point i: 1
    for a raw sample; more for a roll-up, which stands for the slice ``slice_lo[i]`` <= t <
    ``slice_hi[i]`` (a raw sample's slice is its own instant)."""

    t: list[float]
    v: list[float]
    n: list[int]
    slice_lo: list[float]
    slice_hi: list[float]


@dataclass(frozen=True)
class StepTotals:
    """Sums over the steps of one phase with one warm-up flag (every step, raw or rolled up)."""

    phase_id: int
    warmup: bool
    steps: int
    images: int
    wall_s: float
    data_wait_s: float
    transfer_s: float
    compute_s: float
    comm_s: float
    other_s: float
    t_first: float
    t_end: float
    rolled_steps: int = 0  # of ``steps``, those only in roll-ups (their raw rows were dropped)


def _bucket(col: str) -> str:
    # Clamp so the row at exactly t1 lands in the last bucket, not one past it.
    return f"MIN(MAX(CAST(({col} - :t0) / :w AS INTEGER), 0), :last)"


class Aggregates:
    """The aggregate queries of one read-only connection."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self._con = con
        rolled = rollups.has_rollups(con)
        self.steps_sql = rollups.STEPS_UNION if rolled else rollups.STEPS_RAW
        self.samples_sql = rollups.SAMPLES_UNION if rolled else rollups.SAMPLES_RAW

    def step_totals(self, phase_id: int | None = None) -> list[StepTotals]:
        """Per (phase, warm-up flag): count, images and the summed parts of every step."""
        where, args = ("", ()) if phase_id is None else ("WHERE phase_id = ?", (phase_id,))
        sql = (
            f"SELECT phase_id, warmup, SUM(n), COALESCE(SUM(images), 0), SUM(wall), SUM(wait), "
            f"SUM(transfer), SUM(compute), SUM(comm), SUM(other), MIN(t0), MAX(t1), "
            f"SUM(folded) FROM ({self.steps_sql}) {where} GROUP BY phase_id, warmup "
            "ORDER BY phase_id, warmup"
        )
        return [StepTotals(r[0], bool(r[1]), int(r[2]), int(r[3]), r[4], r[5], r[6], r[7], r[8],
                           r[9], r[10], r[11], int(r[12]))
                for r in self._con.execute(sql, args)]

    def step_count(self) -> int:
        row = self._con.execute(f"SELECT COALESCE(SUM(n), 0) FROM ({self.steps_sql})").fetchone()
        return int(row[0])

    def extent(self) -> tuple[float | None, float | None, float | None, float | None, float | None]:
        """(first sample, last sample, first phase start, last phase end, last step end)."""
        s0, s1 = self._con.execute(f"SELECT MIN(t), MAX(t) FROM ({self.samples_sql})").fetchone()
        p0, p1 = self._con.execute(
            "SELECT MIN(started), MAX(COALESCE(ended, started)) FROM phases").fetchone()
        q1 = self._con.execute(f"SELECT MAX(t1) FROM ({self.steps_sql})").fetchone()[0]
        return s0, s1, p0, p1, q1

    def sample_buckets(self, t0: float, bucket_s: float, max_points: int
                       ) -> list[tuple[Any, ...]]:
        """(source, metric, bucket, mean t, min, max, mean, count) per series and bucket."""
        sql = (
            f"SELECT source, metric, {_bucket('t')} AS b, AVG(t), MIN(lo), MAX(hi), "
            f"SUM(total) / SUM(n), SUM(n) FROM ({self.samples_sql}) GROUP BY metric, source, b "
            "ORDER BY metric, source, b"
        )
        # The sort behind GROUP BY is the cost; SQLite's sorter runs on helper threads.
        self._con.execute("PRAGMA threads=4")
        return self._con.execute(sql, {"t0": t0, "w": bucket_s, "last": max_points - 1}).fetchall()

    def step_buckets(self, t0: float, bucket_s: float, max_points: int) -> list[tuple[Any, ...]]:
        """(bucket, mean t, steps, images, wall mean, wall max, wait mean, wait max, transfer
        mean, compute+comm mean, other mean) per bucket of step start times."""
        sql = (
            f"SELECT {_bucket('t0')} AS b, SUM(t0 * n) / SUM(n), SUM(n), SUM(images), "
            "SUM(wall) / SUM(n), MAX(wall_max), SUM(wait) / SUM(n), MAX(wait_max), "
            "SUM(transfer) / SUM(n), SUM(compute + comm) / SUM(n), SUM(other) / SUM(n) "
            f"FROM ({self.steps_sql}) GROUP BY b ORDER BY b"
        )
        return self._con.execute(sql, {"t0": t0, "w": bucket_s, "last": max_points - 1}).fetchall()

    def step_spans(self, max_spans: int) -> tuple[list[tuple[Any, ...]], bool]:
        """Every step when there are at most ``max_spans`` (and none is rolled up); else steps
        merged per phase into about ``max_spans`` time slices. Rows: phase_id, first step, last
        step, count, start, end, wait, transfer, compute+comm, other, images, any warm-up."""
        n, first, last, widest = self._con.execute(
            f"SELECT COALESCE(SUM(n), 0), MIN(t0), MAX(t0), MAX(n) FROM ({self.steps_sql})"
        ).fetchone()
        if not n:
            return [], False
        merged = n > max_spans or widest > 1
        width = (last - first) / max_spans if merged and last > first else None
        group = "phase_id, s0, t0" if width is None else (
            f"phase_id, CAST((t0 - {first!r}) / {width!r} AS INTEGER)")
        sql = (
            "SELECT phase_id, MIN(s0), MAX(s1), SUM(n), MIN(t0), MAX(t1), SUM(wait), "
            "SUM(transfer), SUM(compute + comm), SUM(other), SUM(images), MAX(warmup) "
            f"FROM ({self.steps_sql}) GROUP BY {group} ORDER BY MIN(t0)"
        )
        return self._con.execute(sql).fetchall(), merged

    def series(self, metric: str, source: str | None, t0: float | None, t1: float | None,
               stat: Stat = "mean") -> tuple[list[float], list[float]]:
        """Times and values of one metric; a rolled-up slice reads as its ``stat`` (mean,
        highest or lowest sample) at its samples' mean time."""
        rows = self.series_rows(metric, source, t0, t1, stat)
        return rows.t, rows.v

    def series_rows(self, metric: str, source: str | None, t0: float | None, t1: float | None,
                    stat: Stat = "mean") -> SeriesRows:
        """:meth:`series`, with how many samples stand behind each point and its slice."""
        # A roll-up row's slice is found from its time: the mean time of samples that all lie
        # in one slice lies in it too, and slices start at multiples of the interval.
        w = self._sample_interval_s()
        sql = (f"SELECT t, {_STAT_SQL[stat]}, n, CASE WHEN n > 1 THEN CAST(t / :w AS INTEGER) * :w "
               f"ELSE t END FROM ({self.samples_sql}) WHERE metric = :metric")
        args: dict[str, float | str] = {"w": w, "metric": metric}
        for cond, key, value in (("source = :src", "src", source), ("t >= :t0", "t0", t0),
                                 ("t <= :t1", "t1", t1)):
            if value is not None:
                sql += f" AND {cond}"
                args[key] = value
        rows = SeriesRows([], [], [], [], [])
        for t, v, n, lo in self._con.execute(sql + " ORDER BY t", args):
            rows.t.append(t)
            rows.v.append(v)
            rows.n.append(n)
            rows.slice_lo.append(lo)
            rows.slice_hi.append(lo + w if n > 1 else t)
        return rows

    def _sample_interval_s(self) -> float:
        if "sample_rollups" not in self.samples_sql:
            return rollups.SAMPLE_INTERVAL_S
        return rollups.meta(self._con, "samples_interval_s") or rollups.SAMPLE_INTERVAL_S

    def time_range(self) -> tuple[float, float] | None:
        row = self._con.execute(f"SELECT MIN(t), MAX(t) FROM ({self.samples_sql})").fetchone()
        return None if row is None or row[0] is None else (row[0], row[1])

    def sample_count(self) -> int:
        return int(self._con.execute(
            f"SELECT COALESCE(SUM(n), 0) FROM ({self.samples_sql})").fetchone()[0])
