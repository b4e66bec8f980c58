"""Which rank the others wait for, from when each rank arrives at the gradient all-reduce.

Why arrival, not busy time: DDP is synchronous, so the all-reduce equalises step times, and a
rank slow in *backward* also looks busy only inside ``backward()``, where its wait and its work
are mixed. What cannot be equalised is the order of arrival: every rank records, at the step's
last gradient bucket, when it handed the bucket over and how long it then waited for the
all-reduce to complete (``ArrivalRecord``). Collectives run in the same order on every rank, so
the n-th record of each rank is the same all-reduce: ranks are aligned by sequence number, not
by clocks.

How late a rank was at all-reduce n (``late_s``):

- *measured* when every rank ran on one host: its hand-over time minus the median of the other
  ranks' (one clock, ``time.time()`` in each process);
- *inferred* across hosts (clocks differ by NTP's error): the median of the other ranks' wait
  minus its own. The all-reduce completes at about the same moment everywhere, so whoever
  waited least arrived last; this ignores the completion skew between ranks (gloo's ring
  finishes within a fraction of a millisecond on one host).

A rank is late at an all-reduce when ``late_s`` is at least ``LATE_MIN_S`` and at least
``LATE_STEP_FRAC`` of the median step period (time between a rank's consecutive arrivals).
Recurrence over the compared all-reduces: ``every step`` when it is late in at least
``EVERY_STEP_FRAC`` of them; ``one stretch`` when it is late at least ``STRETCH_MIN`` times in a
row and at most ``STRETCH_OUTSIDE_FRAC`` of the all-reduces outside that run (on time before
and after); ``most steps`` when it is late less often than that but arrives last at
``EVERY_STEP_FRAC`` of them and the others' wait for it, averaged over every all-reduce
(``late_ms_mean``: its lateness where positive, zero elsewhere), is itself at least the late
threshold; ``scattered`` otherwise (noise: no claim).
A straggler is a rank late ``every step``, for ``one stretch`` or at ``most steps``.

Why ``most steps``: a rank whose loading cost varies batch to batch (a random warp's size, a
loaded host stretching every rank's step) can be late by hundreds of milliseconds at half the
all-reduces and by less than the threshold at the rest. Counting late all-reduces alone called
such a rank "scattered", though the others waited on it at every other step (seen: late at
56 % of them, 151 ms at the median, with four times the others' data wait). Scheduling noise is
late rarely and briefly, so the others' mean wait for a noisy rank stays under the threshold
even where it happens to arrive last most of the time (one of two ranks always arrives last).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from stepscope.analysis.contracts_summary import (
    ArrivalAnalysis,
    ArrivalJob,
    NodeRow,
    RankArrival,
    RankRow,
)
from stepscope.analysis.fmt import MISSING, fmt_pct
from stepscope.store.records import ArrivalRecord

WARMUP_ALLREDUCES = 3  # as the step warm-up: first-iteration allocation and bucket rebuilds
LATE_MIN_S = 0.020  # below 20 ms, scheduling noise on a loaded shared host (measured: up to ~30 ms)
LATE_STEP_FRAC = 0.10  # a tenth of a step: a real drag on every rank (its loss is the others' wait)
EVERY_STEP_FRAC = 0.6
STRETCH_MIN = 5
STRETCH_OUTSIDE_FRAC = 0.2  # late at most this share of the all-reduces outside the stretch
STRAGGLER_RECURRENCES = ("every step", "one stretch", "most steps")
MEASURED = "measured: hand-over timestamps of the ranks on one host, one clock"
INFERRED = ("inferred: ranks on several hosts, so from how long each waited for the all-reduce "
            "to complete (whoever waits least arrived last), not from their clocks")


@dataclass
class RankArrivals:
    """One rank's arrivals as its store holds them."""

    rank: int
    host: str | None
    arrivals: list[ArrivalRecord]


@dataclass
class Lateness:
    """One rank's lateness over the compared all-reduces."""

    rank: int
    late_s: list[float] = field(default_factory=list)
    last: list[bool] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


def _common_seqs(ranks: Sequence[RankArrivals]) -> list[int]:
    common = set.intersection(*({a.seq for a in r.arrivals} for r in ranks))
    seqs = sorted(common)
    return seqs[WARMUP_ALLREDUCES:] if len(seqs) > 2 * WARMUP_ALLREDUCES else seqs


def lateness(ranks: Sequence[RankArrivals]) -> tuple[list[Lateness], str]:
    """Per rank, how late it was at each all-reduce every rank reached; and how it was known."""
    by_seq = [{a.seq: a for a in r.arrivals} for r in ranks]
    hosts = {r.host for r in ranks}
    one_clock = len(hosts) == 1 and None not in hosts
    out = [Lateness(rank=r.rank) for r in ranks]
    for seq in _common_seqs(ranks):
        recs = [m[seq] for m in by_seq]
        late = _late_all(recs, one_clock)
        latest = max(late)
        for k, lt in enumerate(out):
            lt.late_s.append(late[k])
            lt.last.append(late[k] >= latest)
            lt.seqs.append(seq)
            lt.times.append(recs[k].t_arrive)
    return out, MEASURED if one_clock else INFERRED


def median_without(vals: Sequence[float], v: float) -> float:
    """The median of sorted ``vals`` with one occurrence of ``v`` left out."""
    i = bisect.bisect_left(vals, v)
    n = len(vals) - 1

    def at(j: int) -> float:
        return vals[j] if j < i else vals[j + 1]

    return (at((n - 1) // 2) + at(n // 2)) / 2.0


def _late_all(recs: Sequence[ArrivalRecord], one_clock: bool) -> list[float]:
    """Each rank's lateness at one all-reduce against the median of the others."""
    if one_clock:
        ts = sorted(r.t_arrive for r in recs)
        return [r.t_arrive - median_without(ts, r.t_arrive) for r in recs]
    ws = sorted(r.wait_s for r in recs)
    return [median_without(ws, r.wait_s) - r.wait_s for r in recs]


def step_period_s(ranks: Sequence[RankArrivals]) -> float | None:
    """Median time between a rank's consecutive all-reduces, over every rank."""
    gaps = [b.t_arrive - a.t_arrive for r in ranks
            for a, b in zip(r.arrivals, r.arrivals[1:], strict=False) if b.seq == a.seq + 1]
    return statistics.median(gaps) if gaps else None


def late_threshold_s(period_s: float | None) -> float:
    return max(LATE_MIN_S, LATE_STEP_FRAC * (period_s or 0.0))


def longest_run(flags: Sequence[bool]) -> tuple[int, int]:
    """``(start, length)`` of the longest run of True in ``flags``."""
    best, start, run_start = (0, 0), 0, None
    for i, f in enumerate([*flags, False]):
        if f and run_start is None:
            run_start = i
        elif not f and run_start is not None:
            if i - run_start > best[1]:
                best = (run_start, i - run_start)
            run_start = None
    start, length = best
    return start, length


def recurrence(late: Sequence[bool]) -> str:
    """``every step``, ``one stretch``, ``scattered`` or ``never`` (see module doc)."""
    n_late = sum(late)
    if not late or n_late == 0:
        return "never"
    if n_late / len(late) >= EVERY_STEP_FRAC:
        return "every step"
    _, length = longest_run(late)
    outside = len(late) - length
    if length >= STRETCH_MIN and (n_late - length) <= STRETCH_OUTSIDE_FRAC * max(outside, 1):
        return "one stretch"
    return "scattered"


def rank_arrival_row(lt: Lateness, threshold_s: float) -> RankArrival:
    """The arrival fields of one rank's ``summary["ranks"]`` entry."""
    flags = [x >= threshold_s for x in lt.late_s]
    n = len(flags)
    rec = recurrence(flags)
    wait_on_s = sum(max(x, 0.0) for x in lt.late_s) / n if n else 0.0
    if (rec == "scattered" and sum(lt.last) >= EVERY_STEP_FRAC * n
            and wait_on_s >= threshold_s):
        rec = "most steps"
    start, length = longest_run(flags)
    late_vals = [x for x, f in zip(lt.late_s, flags, strict=True) if f]
    row: RankArrival = {
        "allreduces_compared": n,
        "arrival_late_ms_median": _ms(statistics.median(lt.late_s)) if n else None,
        "arrived_last_frac": sum(lt.last) / n if n else None,
        "late_allreduce_frac": sum(flags) / n if n else None,
        "late_ms_when_late": _ms(statistics.mean(late_vals)) if late_vals else None,
        "late_ms_mean": _ms(wait_on_s) if n else None,
        "recurrence": rec,
        "arrival_straggler": rec in STRAGGLER_RECURRENCES,
        "late_stretch": None,
    }
    if length and rec == "one stretch":
        row["late_stretch"] = {
            "first_allreduce": lt.seqs[start], "last_allreduce": lt.seqs[start + length - 1],
            "t_start": lt.times[start], "t_end": lt.times[start + length - 1],
            "allreduces": length,
        }
    return row


def _ms(s: float) -> float:
    return s * 1000.0


def analyze_arrivals(ranks: Sequence[RankArrivals]) -> ArrivalAnalysis | None:
    """Per-rank arrival rows (by rank) and the job's arrival section; None without arrivals on
    every rank (a store from before arrivals were recorded, or a script with its own hook)."""
    if len(ranks) < 2 or any(not r.arrivals for r in ranks):
        return None
    lts, how = lateness(ranks)
    if not lts or not lts[0].late_s:
        return None
    period = step_period_s(ranks)
    threshold = late_threshold_s(period)
    rows = {lt.rank: rank_arrival_row(lt, threshold) for lt in lts}
    return {
        "rows": rows,
        "job": {
            "method": how,
            "allreduces_compared": len(lts[0].late_s),
            "step_period_ms": None if period is None else _ms(period),
            "late_threshold_ms": _ms(threshold),
            "stragglers": [k for k, r in rows.items() if r["arrival_straggler"]],
        },
    }


def arrival_evidence(rank: int, row: RankRow, job: ArrivalJob) -> list[str]:
    """Sentences that name the measurements behind an arrival straggler."""
    n = row["allreduces_compared"]
    # A straggler by arrival was late at some all-reduces, so these figures exist; the
    # formatters say "—" rather than fail if a row ever lacks one.
    late_ms = row["late_ms_when_late"]
    lines = [
        f"rank {rank} arrived last at {fmt_pct(row['arrived_last_frac'])} of {n} gradient "
        f"all-reduces, {MISSING if late_ms is None else f'{late_ms:.1f}'} ms after the other "
        "ranks when late "
        f"(late = at least {job['late_threshold_ms']:.1f} ms; {job['method']})",
    ]
    stretch = row.get("late_stretch")
    if row["recurrence"] == "every step":
        lines.append(f"late at {fmt_pct(row['late_allreduce_frac'])} of the all-reduces: "
                     "every step, not one bad stretch")
    elif row["recurrence"] == "most steps":
        mean_ms = row.get("late_ms_mean")
        lines.append(f"late at {fmt_pct(row['late_allreduce_frac'])} of the all-reduces and "
                     "less late at the rest: the other ranks waited "
                     f"{MISSING if mean_ms is None else f'{mean_ms:.1f}'} ms for it per "
                     "all-reduce on average, most steps, not one bad stretch")
    elif stretch:
        lines.append(f"late for one stretch: all-reduces {stretch['first_allreduce']}–"
                     f"{stretch['last_allreduce']} ({stretch['t_end'] - stretch['t_start']:.1f} s), "
                     "on time before and after")
    return lines


# Here, not in ranks.py, so that ranks.py and rankscale.py both import it without a circle.
def nodes(rows: Sequence[RankRow]) -> list[NodeRow]:
    """Ranks grouped by node: the host they ran on (``dist.host``) and, where the launcher
    numbers nodes (torchrun's GROUP_RANK, Lightning's NODE_RANK), that number, in rank order."""
    by_node: dict[tuple[str, int | None], list[int]] = {}
    for r in rows:
        by_node.setdefault((r["host"] or "unknown host", r.get("node_rank")), []).append(r["rank"])
    out: list[NodeRow] = []
    for (host, node_rank), ks in sorted(by_node.items(), key=lambda kv: kv[1][0]):
        entry: NodeRow = {"host": host, "ranks": ks,
                                 "stragglers": [r["rank"] for r in rows
                                                if r["rank"] in ks and r["straggler"]]}
        if node_rank is not None:
            entry["node_rank"] = node_rank
        out.append(entry)
    return out
