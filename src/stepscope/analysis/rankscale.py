"""Merging many ranks with a bounded cost: per-rank roll-ups instead of raw steps.

The detailed merge (``ranks.merge_ranks``) compares every rank with the median of the *other*
ranks at every step, and summarizes each rank's phases from its samples: its cost grows with
ranks² × steps. Above ``ROLLUP_ABOVE_RANKS`` ranks the report is built from roll-ups instead:

- each store answers one aggregate query (``RunReader.train_step_totals``: sums of the steady
  training steps' parts), not its rows;
- arrivals are compared on at most ``ARRIVAL_SAMPLE`` all-reduces every rank reached, evenly
  spaced (``seq % stride == 0``), against the median of *all* ranks at each (with hundreds of
  ranks, leaving one out moves the median by nothing that matters);
- a rank's cause comes from its rolled-up parts against the median rank's.

So the cost is ranks × (one query + ``ARRIVAL_SAMPLE`` arrivals): linear in ranks, flat in the
run's length. ``bench/rank_merge_scale.py`` measures it at 64, 512 and 4,096 ranks.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.analysis.arrivals import (
    INFERRED,
    MEASURED,
    Lateness,
    late_threshold_s,
    nodes,
    rank_arrival_row,
)
from stepscope.analysis.contracts_summary import MergedRanks, RankRow
from stepscope.store.db import RunReader
from stepscope.store.records import ArrivalRecord

ROLLUP_ABOVE_RANKS = 64
ARRIVAL_SAMPLE = 512
PARTS = {"data_wait_s": "input", "compute_s": "compute", "transfer_s": "transfer",
         "other_s": "overhead"}
MIN_EXCESS_S = 0.001


@dataclass
class RankRollup:
    """One rank reduced to sums and an arrival sample."""

    rank: int
    world_size: int
    host: str | None
    node_rank: int | None
    totals: dict[str, float]
    arrivals: list[ArrivalRecord] = field(default_factory=list)
    status: str | None = None
    exit_code: int | None = None


def read_rollup(reader: RunReader, stride: int, last_seq: int) -> RankRollup:
    run = reader.run()
    facts = reader.facts()

    def fact(key: str) -> Any:
        f = facts.get(key)
        return None if f is None else f.value

    return RankRollup(rank=run.rank, world_size=run.world_size, host=fact("dist.host"), node_rank=fact("dist.node_rank"),
                      totals=reader.train_step_totals(),
                      arrivals=reader.arrival_sample(stride, last_seq),
                      status=fact("dist.status") or run.status,
                      exit_code=fact("dist.exit_code") if "dist.status" in facts
                      else run.exit_code)


def _open(run_dir: Path, name: str) -> RunReader:
    return RunReader(run_dir, db_name=name)


def sample_plan(run_dir: Path, names: Sequence[str]) -> tuple[int, int]:
    """``(stride, last_seq)``: at most ``ARRIVAL_SAMPLE`` all-reduces every rank reached."""
    lasts = []
    for name in names:  # one store open at a time: thousands would exhaust file descriptors
        with _open(run_dir, name) as reader:
            lasts.append(reader.last_arrival_seq())
    last = min((x for x in lasts if x is not None), default=-1) if None not in lasts else -1
    return max(1, (last + 1) // ARRIVAL_SAMPLE + (1 if (last + 1) % ARRIVAL_SAMPLE else 0)), last


def _per_step(r: RankRollup, key: str) -> float:
    n = r.totals["steps"]
    return r.totals[key] / n if n else 0.0


def _lateness(ranks: Sequence[RankRollup]) -> tuple[list[Lateness], str]:
    by_seq = [{a.seq: a for a in r.arrivals} for r in ranks]
    common = sorted(set.intersection(*(set(m) for m in by_seq))) if by_seq else []
    hosts = {r.host for r in ranks}
    one_clock = len(hosts) == 1 and None not in hosts
    out = [Lateness(rank=r.rank) for r in ranks]
    for seq in common:
        recs = [m[seq] for m in by_seq]
        if one_clock:
            mid = statistics.median(a.t_arrive for a in recs)
            late = [a.t_arrive - mid for a in recs]
        else:
            mid = statistics.median(a.wait_s for a in recs)
            late = [mid - a.wait_s for a in recs]
        latest = max(late)
        for k, lt in enumerate(out):
            lt.late_s.append(late[k])
            lt.last.append(late[k] >= latest)
            lt.seqs.append(seq)
            lt.times.append(recs[k].t_arrive)
    return out, MEASURED if one_clock else INFERRED


def _cause(r: RankRollup, medians: dict[str, float]) -> str | None:
    part = max(PARTS, key=lambda p: _per_step(r, p) - medians[p])
    return PARTS[part] if _per_step(r, part) - medians[part] >= MIN_EXCESS_S else None


def rollup_merge(run_dir: Path, names: Sequence[str]) -> MergedRanks:
    """``{"ranks": [...], "distributed": {...}}`` like ``merge_ranks``, from the roll-ups of the
    stores ``names`` in ``run_dir``."""
    stride, last = sample_plan(run_dir, names)
    rolls = []
    for name in names:
        with _open(run_dir, name) as reader:
            rolls.append(read_rollup(reader, stride, last))
    ranks = sorted(rolls, key=lambda r: r.rank)
    medians = {p: statistics.median(_per_step(r, p) for r in ranks)
               for p in (*PARTS, "wall_s", "comm_s")}
    lts, how = _lateness(ranks) if all(r.arrivals for r in ranks) else ([], "")
    period = statistics.median(
        (b.t_arrive - a.t_arrive) / (b.seq - a.seq) for r in ranks
        for a, b in zip(r.arrivals, r.arrivals[1:], strict=False)) if lts else None
    threshold = late_threshold_s(period)
    rows: list[RankRow] = []
    for k, r in enumerate(ranks):
        row: RankRow = {
            "rank": r.rank, "host": r.host, "node_rank": r.node_rank,
            "status": r.status, "exit_code": r.exit_code,
            "steps_compared": int(r.totals["steps"]),
            "data_wait_ms_per_step": 1000.0 * _per_step(r, "data_wait_s"),
            "compute_ms_per_step": 1000.0 * _per_step(r, "compute_s"),
            "transfer_ms_per_step": 1000.0 * _per_step(r, "transfer_s"),
            "other_ms_per_step": 1000.0 * _per_step(r, "other_s"),
            "wall_ms_per_step": 1000.0 * _per_step(r, "wall_s"),
            "comm_ms_per_step": 1000.0 * _per_step(r, "comm_s"),
            "straggler": False, "straggler_by": "arrival" if lts else None, "cause": None,
        }
        if lts and lts[k].late_s:
            row.update(rank_arrival_row(lts[k], threshold))
        row["straggler"] = bool(row.get("arrival_straggler"))
        row["cause"] = _cause(r, medians) if row["straggler"] else None
        rows.append(row)
    stragglers = [r["rank"] for r in rows if r["straggler"]]
    return {"ranks": rows, "distributed": {
        "mode": "rollup", "world_size": max(r.world_size for r in ranks),
        "ranks_recorded": [r.rank for r in ranks], "stragglers": stragglers,
        "nodes": nodes(rows),
        "arrival": None if not lts else {
            "method": how, "allreduces_compared": len(lts[0].late_s), "sample_stride": stride,
            "step_period_ms": None if period is None else period * 1000.0,
            "late_threshold_ms": threshold * 1000.0, "stragglers": stragglers},
        "median_ms_per_step": {p: 1000.0 * v for p, v in medians.items()},
    }}
