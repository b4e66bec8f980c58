"""Roll-ups: what keeps ``run.db`` small and its reads fast however long the run.

A raw step row costs ~80 bytes and a raw sample ~60; a week at 100 steps/s and ~40 series at
1 Hz would be several GB, and every report would read all of it. So the writer keeps raw rows
only for a recent window and folds older ones into per-interval roll-ups:

- ``step_rollups``: one row per (phase, warm-up flag, ``STEP_INTERVAL_S`` slice of time) with the
  count, images, and for each part of the split (wall, data wait, transfer, compute, comm, other)
  its sum, minimum, maximum and 50th/90th/99th percentiles. Sums make every per-phase fraction
  exact; the percentiles keep the shape of each slice.
- ``sample_rollups``: one row per (source, metric, ``SAMPLE_INTERVAL_S`` slice) with the count,
  mean, minimum and maximum.

Steps are folded by rowid, one pass at a time: every step with a rowid at or below
``steps_rolled_rowid`` (kept in ``store_meta``) is in exactly one roll-up row, whose ``pass_hi``
is the last rowid of its pass. Raw rows beyond the window are deleted a whole pass at a time, and
that pass's roll-ups marked ``raw_gone``. A reader adds the raw rows still kept and the roll-ups
marked ``raw_gone`` in one statement: each step counts exactly once, even while the writer works,
and a short run reads as raw steps only.

This module, :mod:`stepscope.store.stepfold` (the writer's side of the step roll-ups) and
:mod:`stepscope.store.db` are the only ones that speak SQL to the steps.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

# 10 s slices: ~8,600 step roll-up rows (~3.5 MB) per day, yet a week still plots at
# 1,000 points without a hole.
STEP_INTERVAL_S = 10.0
# Raw steps kept: the newest 50,000 (~4 MB; 8 minutes at 100 steps/s). Straggler comparison
# and the Chrome trace's per-step spans use this window.
KEEP_RAW_STEPS = 50_000
SAMPLE_INTERVAL_S = 60.0
# Raw samples kept: the newest 15 minutes of every series (~40 series at 1 Hz: ~2.5 MB). A
# series sampled less than twice a slice (residency on a big dataset) is never folded: its raw
# samples cost no more than roll-ups would.
KEEP_RAW_SAMPLES_S = 900.0
PERCENTILES = (50, 90, 99)
PERCENTILE_SAMPLE = 1024
PARTS = ("wall", "data_wait", "transfer", "compute", "comm", "other")
# The raw rows of one roll-up group: rowids blo..bhi of one phase and warm-up flag in one slice.
_GROUP = ("rowid >= :blo AND rowid <= :bhi AND phase_id IS :p AND warmup IS :u "
          "AND t_start >= :t0 AND t_start < :t1")

ROLLUP_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS store_meta (key TEXT PRIMARY KEY, value REAL);
CREATE TABLE IF NOT EXISTS step_rollups (
    phase_id INTEGER, warmup INTEGER, bucket INTEGER, t_first REAL, t_end REAL,
    step_first INTEGER, step_last INTEGER, steps INTEGER, images INTEGER,
    loss_sum REAL, loss_n INTEGER,
    {", ".join(f"{p}_sum REAL, {p}_min REAL, {p}_max REAL, " + ", ".join(f"{p}_p{q} REAL" for q in PERCENTILES) for p in PARTS)},
    pass_hi INTEGER, raw_gone INTEGER DEFAULT 0
);
CREATE INDEX IF NOT EXISTS step_rollups_t ON step_rollups (t_first);
CREATE TABLE IF NOT EXISTS sample_rollups (
    t REAL, source TEXT, metric TEXT, n INTEGER, mean REAL, lo REAL, hi REAL
);
CREATE INDEX IF NOT EXISTS sample_rollups_metric ON sample_rollups (metric, source, t);
"""

# Every step once: every raw row still kept, plus the roll-ups of raw rows already deleted.
# Columns: phase_id, warmup, t0, t1, n, images, s0, s1, wall, wall_max, wait, wait_max, transfer,
# compute, comm, other, folded (how many of the row's steps are no longer raw).
STEPS_UNION = (
    "SELECT phase_id, warmup, t_start AS t0, t_start + wall_s AS t1, 1 AS n, images, "
    "step AS s0, step AS s1, wall_s AS wall, wall_s AS wall_max, data_wait_s AS wait, "
    "data_wait_s AS wait_max, transfer_s AS transfer, compute_s AS compute, "
    "COALESCE(comm_s, 0) AS comm, other_s AS other, 0 AS folded FROM steps "
    "UNION ALL SELECT phase_id, warmup, t_first, t_end, steps, images, step_first, step_last, "
    "wall_sum, wall_max, data_wait_sum, data_wait_max, transfer_sum, compute_sum, comm_sum, "
    "other_sum, steps FROM step_rollups WHERE raw_gone = 1"
)
STEPS_RAW = (
    "SELECT phase_id, warmup, t_start AS t0, t_start + wall_s AS t1, 1 AS n, images, "
    "step AS s0, step AS s1, wall_s AS wall, wall_s AS wall_max, data_wait_s AS wait, "
    "data_wait_s AS wait_max, transfer_s AS transfer, compute_s AS compute, "
    "COALESCE(comm_s, 0) AS comm, other_s AS other, 0 AS folded FROM steps"
)
# Every sample once. Columns: t, source, metric, n, total, lo, hi.
SAMPLES_UNION = (
    "SELECT t, source, metric, 1 AS n, value AS total, value AS lo, value AS hi FROM samples "
    "UNION ALL SELECT t, source, metric, n, mean * n, lo, hi FROM sample_rollups"
)
SAMPLES_RAW = "SELECT t, source, metric, 1 AS n, value AS total, value AS lo, value AS hi FROM samples"


def has_rollups(con: sqlite3.Connection) -> bool:
    """Databases written before roll-ups existed hold raw rows only."""
    row = con.execute(
        "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='step_rollups'"
    ).fetchone()
    return bool(row[0])


def meta(con: sqlite3.Connection, key: str) -> float:
    row = con.execute("SELECT value FROM store_meta WHERE key=?", (key,)).fetchone()
    return float(row[0]) if row else 0.0


def set_meta(con: sqlite3.Connection, key: str, value: float) -> None:
    con.execute("INSERT OR REPLACE INTO store_meta VALUES (?, ?)", (key, value))


def roll_up_steps(con: sqlite3.Connection, *, final: bool, interval_s: float = STEP_INTERVAL_S,
                  keep_raw: int = KEEP_RAW_STEPS) -> None:
    """Fold raw steps of finished time slices (all of them when ``final``) into roll-ups.

    Runs inside the writer's open transaction, so readers see the roll-up and the moved
    watermark together.
    """
    rolled = int(meta(con, "steps_rolled_rowid"))
    top, newest_t = con.execute(
        "SELECT MAX(rowid), MAX(t_start) FROM steps WHERE rowid > ?", (rolled,)
    ).fetchone()
    if top is not None:
        upto = top
        if not final:
            # A slice is finished once a step of a later slice exists; steps arrive in time
            # order (a GPU step may arrive a few steps late: it lands in a roll-up row of its own).
            cut = math.floor(newest_t / interval_s) * interval_s
            upto = con.execute(
                "SELECT MAX(rowid) FROM steps WHERE rowid > ? AND t_start < ?", (rolled, cut)
            ).fetchone()[0]
        if upto is not None:
            _insert_step_rollups(con, rolled, int(upto), interval_s)
            set_meta(con, "steps_rolled_rowid", float(upto))
    drop_old_raw_steps(con, int(top if top is not None else rolled), keep_raw)


def drop_old_raw_steps(con: sqlite3.Connection, top: int, keep_raw: int) -> None:
    # Raw rows beyond the window go, a whole pass at a time, so that each roll-up row either
    # stands for steps no longer raw or for steps still raw, never for a mix.
    gone = con.execute(
        "SELECT MAX(pass_hi) FROM step_rollups WHERE raw_gone = 0 AND pass_hi <= ?",
        (top - keep_raw,),
    ).fetchone()[0]
    if gone is not None:
        con.execute("DELETE FROM steps WHERE rowid <= ?", (gone,))
        con.execute("UPDATE step_rollups SET raw_gone = 1 WHERE raw_gone = 0 AND pass_hi <= ?",
                    (gone,))


def prepare_writer(con: sqlite3.Connection) -> None:
    """Before a (resumed) run appends: with no raw step left, SQLite numbers the next one 1."""
    if con.execute("SELECT COUNT(*) FROM (SELECT 1 FROM steps LIMIT 1)").fetchone()[0] == 0:
        set_meta(con, "steps_rolled_rowid", 0.0)


def _insert_step_rollups(con: sqlite3.Connection, lo: int, hi: int, interval_s: float) -> None:
    # GROUP BY would sort every row; the rows of a pass are a few seconds of steps from one or
    # two phases, so the candidate groups are few and each is one streaming scan of its slice.
    rng = {"lo": lo, "hi": hi}
    where = "rowid > :lo AND rowid <= :hi"
    pairs = con.execute(f"SELECT DISTINCT phase_id, warmup FROM steps WHERE {where}", rng).fetchall()
    t_min, t_max, n = con.execute(
        f"SELECT MIN(t_start), MAX(t_start), COUNT(*) FROM steps WHERE {where}", rng).fetchone()
    buckets = range(math.floor(t_min / interval_s), math.floor(t_max / interval_s) + 1)
    rows = _step_rollup_rows(con, lo, hi, pairs, buckets, interval_s, by_slice=True)
    if sum(r[7] for r in rows) != n:
        # A step out of time order (a GPU step emitted late) fell outside its slice's rowids:
        # every slice scans the whole pass instead.
        rows = _step_rollup_rows(con, lo, hi, pairs, buckets, interval_s, by_slice=False)
    if rows:
        con.executemany(
            f"INSERT INTO step_rollups VALUES ({','.join('?' * len(rows[0]))})", rows
        )


def _step_rollup_rows(con: sqlite3.Connection, lo: int, hi: int, pairs: list[Any],
                      buckets: range, interval_s: float, *, by_slice: bool) -> list[tuple[Any, ...]]:
    """Roll-up rows of the pass (lo, hi], one per slice and (phase, warm-up) pair.

    ``by_slice``: each slice reads only its own rowids, found by bisecting on t_start (steps
    arrive in time order). Scanning the whole pass for every slice made a pass that spans many
    slices (a long gap between roll-ups, or ``compact_run`` on a finished run) quadratic.
    """
    cols = _part_columns()
    aggs = ", ".join(f"SUM({c}), MIN({c}), MAX({c})" for c in cols)
    starts = [lo + 1]
    if by_slice:
        starts += [_first_rowid_at(con, lo, hi, b * interval_s) for b in buckets[1:]]
    rows = []
    for i, b in enumerate(buckets):
        blo, bhi = (starts[i], starts[i + 1] - 1 if i + 1 < len(starts) else hi) if by_slice \
            else (lo + 1, hi)
        if blo > bhi:
            continue
        for phase_id, warmup in pairs:
            args = {"blo": blo, "bhi": bhi, "p": phase_id, "u": warmup, "t0": b * interval_s,
                    "t1": (b + 1) * interval_s}
            *g, first, last = con.execute(
                f"SELECT MIN(t_start), MAX(t_start + wall_s), MIN(step), MAX(step), COUNT(*), "
                f"SUM(images), SUM(loss), COUNT(loss), {aggs}, MIN(rowid), MAX(rowid) "
                f"FROM steps WHERE {_GROUP}", args,
            ).fetchone()
            if g[4]:
                rows.append((*rollup_row(con, (phase_id, warmup, b, *g),
                                         {**args, "first": first, "last": last}), hi, 0))
    return rows


def _first_rowid_at(con: sqlite3.Connection, lo: int, hi: int, t: float) -> int:
    """The first rowid in (lo, hi] of a step starting at or after ``t``, if the steps there are
    in time order (``hi + 1`` if none): a bisection of rowid seeks, never a scan."""
    a, b = lo + 1, hi + 1
    while a < b:
        mid = (a + b) // 2
        row = con.execute("SELECT rowid, t_start FROM steps WHERE rowid >= ? AND rowid <= ? "
                          "ORDER BY rowid LIMIT 1", (mid, hi)).fetchone()
        if row is None or row[1] >= t:
            b = mid
        else:
            a = row[0] + 1
    return a


def rollup_row(con: sqlite3.Connection, g: tuple[Any, ...],
               # free-form: SQL parameters by name (_GROUP's, and the group's first and last rowid)
               args: dict[str, Any]) -> tuple[Any, ...]:
    """One roll-up row: the group's aggregates ``g`` (phase, warm-up, slice, then the columns of
    ``step_rollups`` up to ``loss_n``, then each part's sum, minimum and maximum) plus each
    part's percentiles, read from an even sample of the group's raw rows."""
    n = g[7]
    # Percentiles from an even sample of at most PERCENTILE_SAMPLE steps of the slice (all of
    # them at up to 100 steps/s): sorting every step of a fast loop would cost more than
    # timing it did. The sample is read by rowid lookups across the group's rowid span (its
    # steps are consecutive rows, bar the warm-up's and a late GPU step): scanning the whole
    # pass again for it cost a third of the roll-up.
    span = args["last"] - args["first"] + 1
    pick = {**args, "k": max(1, span // PERCENTILE_SAMPLE)}
    sample = con.execute(
        "WITH RECURSIVE pick(id) AS (SELECT :first UNION ALL SELECT id + :k FROM pick "
        "WHERE id + :k <= :last) "
        f"SELECT {', '.join(_part_columns())} FROM pick JOIN steps ON steps.rowid = pick.id "
        f"WHERE {_GROUP}", pick,
    ).fetchall()
    if len(sample) < min(n, PERCENTILE_SAMPLE) // 2:  # a sparse group: read it by a scan
        sample = con.execute(
            f"SELECT {', '.join(_part_columns())} FROM steps WHERE {_GROUP} AND rowid % :k = 0",
            {**args, "k": max(1, n // PERCENTILE_SAMPLE)},
        ).fetchall()
    sample = sample or [tuple(g[11 + 3 * i] / n for i in range(len(PARTS)))]
    parts: list[Any] = []
    for i, column in enumerate(zip(*sample, strict=True)):
        ordered = sorted(column)
        pcts = [ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)] for q in PERCENTILES]
        parts += [*g[11 + 3 * i: 14 + 3 * i], *pcts]
    return (*g[:11], *parts)


def _part_columns() -> list[str]:
    return ["wall_s", "data_wait_s", "transfer_s", "compute_s", "COALESCE(comm_s, 0)", "other_s"]


def roll_up_samples(con: sqlite3.Connection, newest_t: float, *,
                    interval_s: float = SAMPLE_INTERVAL_S,
                    keep_raw_s: float = KEEP_RAW_SAMPLES_S) -> None:
    """Fold samples older than the raw window into per-slice mean, minimum and maximum."""
    cut = math.floor((newest_t - keep_raw_s) / interval_s) * interval_s
    if cut <= meta(con, "samples_rolled_t"):
        return
    args = {"cut": cut, "w": interval_s}
    con.execute(
        "INSERT INTO sample_rollups SELECT AVG(t), source, metric, COUNT(*), AVG(value), "
        "MIN(value), MAX(value) FROM samples WHERE t < :cut "
        "GROUP BY source, metric, CAST(t / :w AS INTEGER) HAVING COUNT(*) > 1", args,
    )
    con.execute(
        "DELETE FROM samples WHERE t < :cut AND (source, metric, CAST(t / :w AS INTEGER)) IN "
        "(SELECT source, metric, CAST(t / :w AS INTEGER) FROM samples WHERE t < :cut "
        "GROUP BY 1, 2, 3 HAVING COUNT(*) > 1)", args,
    )
    set_meta(con, "samples_rolled_t", cut)
    # Readers find a roll-up row's slice from its time and this width (queries.series_rows).
    set_meta(con, "samples_interval_s", interval_s)
