"""One picture of a distributed run from its per-rank stores (``run.db``, ``run.rank<k>.db``).

Every rank records its own store (train/distributed.py). This module reads several of them and
answers: how fast each rank went, how its steps split, how long the gradient all-reduce took,
which rank the others waited for, and why.

Why stragglers are found by *busy* time, not throughput: DDP is synchronous. Every rank's
``backward()`` waits in the all-reduce until the slowest rank's gradients arrive, so all ranks
finish every step together and show the same images/s. What differs is how the step is spent:
the slow rank is busy (data wait + copy + compute + other) for most of it, the others finish
early and spend the difference in ``comm_s``. A rank's *busy* time is ``wall_s - comm_s``.

A straggler is a rank whose busy time, over the training steps all ranks share (warm-up left
out), is at least ``STRAGGLER_EXCESS_FRAC`` above the median of the other ranks' and which is
the busiest rank in at least ``STRAGGLER_CONSISTENT_FRAC`` of those steps (consistently, not
once). Its cause is the part of the step with the largest excess over the other ranks' median:
``input`` (data wait), ``compute``, ``transfer`` or ``overhead``; for ``input`` the rank's own
phase analysis adds why (``storage``, ``cpu``, ``workers``), with its loader CPU and disk reads.
Validation runs no collective per step, so only training steps decide.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stepscope.analysis.arrivals import (
    RankArrivals,
    analyze_arrivals,
    arrival_evidence,
    median_without,
    nodes,
)
from stepscope.analysis.contracts import Finding
from stepscope.analysis.contracts_summary import (
    Distributed,
    MergedRanks,
    PhaseRow,
    RankRow,
    StepSplitFields,
    Summary,
)
from stepscope.analysis.fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_ratio
from stepscope.analysis.phases import (
    PhaseContext,
    PhaseTotals,
    StepSplit,
    nested_seconds,
    split_fields,
    summarize_phase,
    totals_by_phase,
)
from stepscope.analysis.samples import SampleCache
from stepscope.analysis.verdicts import BOUND_FRAC, decide_verdict
from stepscope.policy import weighted_mean
from stepscope.store.db import RunReader
from stepscope.store.records import ArrivalRecord, Fact, ProcessInfo, StepRecord
from stepscope.store.rundir import RunDir

STRAGGLER_EXCESS_FRAC = 0.15
STRAGGLER_CONSISTENT_FRAC = 0.6
MIN_EXCESS_S = 0.001  # below a millisecond per step, scheduling noise: nobody is a straggler
COMM_BOUND_FRAC = BOUND_FRAC
PARTS = {"data_wait": "input", "compute": "compute", "transfer": "transfer", "other": "overhead"}
COMM_S_INCLUDES = (
    "comm_s: wall time during which at least one gradient all-reduce was in flight (DDP comm "
    "hook: bucket handed over → all-reduce future completed, union over buckets); includes "
    "waiting for slower ranks; taken out of compute_s"
)

StepKey = tuple[int, int]  # (epoch, step) of a training step
_OthersKey = Literal["comm_ms_per_step", "comm_frac", "disk_read_bytes", "main_cpu_pct"]


@dataclass
class RankData:
    """What one rank's store says, reduced to what the merge compares."""

    rank: int
    world_size: int
    host: str | None
    local_rank: int | None
    train_steps: dict[StepKey, StepRecord] = field(default_factory=dict)
    phases: list[PhaseRow] = field(default_factory=list)
    arrivals: list[ArrivalRecord] = field(default_factory=list)
    node_rank: int | None = None
    status: str | None = None
    exit_code: int | None = None


def find_rank_stores(run_dir: Path) -> list[str]:
    """Store names of the ranks other than 0 in ``run_dir`` (``run.rank<k>.db``), by rank."""
    return RunDir(Path(run_dir)).rank_db_names()


def current_main(processes: list[ProcessInfo], run_pid: int | None) -> int | None:
    """The root process of the run the ``runs`` row describes. A store written twice (``train
    --resume``, ``watch --out`` on a used folder) keeps each attempt's tree and the newest
    attempt's facts; the row holds the newest writer's pid: the training process (``train``)
    or its watching parent. Else the newest main. (The first main once gave a Keras run the
    15 MB RSS of an attempt that failed at start-up: −5145 % unattributed memory.)"""
    mains = [p for p in processes if p.role == "main"]  # ordered by first_t
    if not mains:
        return run_pid
    ours = [p for p in mains if run_pid is not None and run_pid in (p.pid, p.ppid)]
    return (ours or mains)[-1].pid


def own_processes(reader: RunReader) -> tuple[int | None, list[ProcessInfo]]:
    """This store's training process and the processes that are its own.

    A store written by ``stepscope watch`` for a rank names the rank's process (``dist.pid``);
    ``run.db`` then holds the whole command's tree (launcher, every rank), so rank 0 keeps its
    own subtree without the other ranks' (``watch.rank_pids``). Otherwise the tree's root: see
    :func:`current_main`."""
    processes, facts = reader.processes(), reader.facts()
    mine = _fact_value(facts, "dist.pid")
    if not isinstance(mine, int):
        run_pid = reader.run().pid or None
        return current_main(processes, run_pid), processes
    pids = _fact_value(facts, "watch.rank_pids") or {}
    others = {int(p) for p in pids.values() if isinstance(p, int) and p != mine}
    children: dict[int, list[int]] = {}
    for p in processes:
        children.setdefault(p.ppid, []).append(p.pid)
    keep, todo = {mine}, [mine]
    while todo:
        for kid in children.get(todo.pop(), []):
            if kid not in keep and kid not in others:
                keep.add(kid)
                todo.append(kid)
    return mine, [p for p in processes if p.pid in keep]


def load_rank(reader: RunReader) -> RankData:
    """Read one rank's run row, training steps and summarized phases."""
    run = reader.run()
    facts = reader.facts()
    main_pid, processes = own_processes(reader)
    ctx = PhaseContext(cache=SampleCache(reader), processes=processes,
                       main_pid=main_pid, gpu_index=None)
    # Phase figures from the store's totals (every step, raw or rolled up); the per-step
    # comparison between ranks uses the raw steps still kept (the recent window on long runs).
    steps_by_phase: dict[int, list[StepRecord]] = {}
    for s in reader.steps():
        steps_by_phase.setdefault(s.phase_id, []).append(s)
    totals = totals_by_phase(reader.aggregates.step_totals(), steps_by_phase)
    data = RankData(rank=run.rank, world_size=run.world_size,
                    host=_fact_value(facts, "dist.host"),
                    local_rank=_fact_value(facts, "dist.local_rank"),
                    arrivals=reader.arrivals(),
                    node_rank=_fact_value(facts, "dist.node_rank"),
                    # watch records how each rank's own process ended; train's rank row says it
                    status=_fact_value(facts, "dist.status") or run.status,
                    exit_code=_fact_value(facts, "dist.exit_code") if "dist.status" in facts
                    else run.exit_code)
    ctx.nested_s = nested_seconds(records := reader.phases(), totals)
    for ph in records:
        steps = steps_by_phase.get(ph.phase_id, [])
        data.phases.append(summarize_phase(ph, totals.get(ph.phase_id, PhaseTotals()), ctx))
        if ph.phase == "train":
            for s in steps:
                data.train_steps[(ph.epoch, s.step)] = s
    return data


def _fact_value(facts: dict[str, Fact], key: str) -> Any:
    f = facts.get(key)
    return None if f is None else f.value


def _aligned_keys(ranks: Sequence[RankData]) -> list[StepKey]:
    """Training steps every rank recorded; steady ones only when there are any."""
    common = set.intersection(*(set(r.train_steps) for r in ranks)) if ranks else set()
    steady = [k for k in common if not any(r.train_steps[k].warmup for r in ranks)]
    return sorted(steady or common)


def _busy_s(s: StepRecord) -> float:
    return max(0.0, s.wall_s - s.comm_s)


def _part_s(s: StepRecord, part: str) -> float:
    return float(getattr(s, f"{part}_s"))


SortedSteps = dict[StepKey, dict[str, list[float]]]


def sort_steps(ranks: Sequence[RankData], keys: Sequence[StepKey]) -> SortedSteps:
    """Per aligned step, each figure over all ranks, sorted: every rank's "median of the others"
    then costs a bisection, not a pass over the ranks (the merge stays ~ranks × steps)."""
    out: SortedSteps = {}
    for key in keys:
        recs = [r.train_steps[key] for r in ranks]
        out[key] = {"busy": sorted(_busy_s(s) for s in recs),
                    **{p: sorted(_part_s(s, p) for s in recs) for p in PARTS}}
    return out


@dataclass
class Excess:
    """How rank ``k`` compares with the median of the other ranks over the aligned steps."""

    busy_s: float = 0.0
    others_busy_s: float = 0.0
    slowest_steps: int = 0
    steps: int = 0
    parts_s: dict[str, float] = field(default_factory=dict)
    others_parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.busy_s / self.others_busy_s if self.others_busy_s > 0 else None

    @property
    def per_step_s(self) -> float:
        return (self.busy_s - self.others_busy_s) / self.steps if self.steps else 0.0


def compare_rank(ranks: Sequence[RankData], k: int, keys: Sequence[StepKey],
                 table: SortedSteps | None = None) -> Excess:
    """Rank ``k``'s busy time and step parts against the other ranks', step by step."""
    table = sort_steps(ranks, keys) if table is None else table
    ex = Excess(parts_s=dict.fromkeys(PARTS, 0.0), others_parts_s=dict.fromkeys(PARTS, 0.0))
    for key in keys:
        mine = ranks[k].train_steps[key]
        sorted_busy = table[key]["busy"]
        busy = _busy_s(mine)
        ex.busy_s += busy
        ex.others_busy_s += median_without(sorted_busy, busy)
        ex.slowest_steps += busy >= sorted_busy[-1]
        ex.steps += 1
        for part in PARTS:
            v = _part_s(mine, part)
            ex.parts_s[part] += v
            ex.others_parts_s[part] += median_without(table[key][part], v)
    return ex


def is_straggler(ex: Excess) -> bool:
    """Consistently and clearly busier than the other ranks (see module doc)."""
    if ex.steps == 0 or ex.ratio is None:
        return False
    return (ex.ratio >= 1.0 + STRAGGLER_EXCESS_FRAC
            and ex.slowest_steps / ex.steps >= STRAGGLER_CONSISTENT_FRAC
            and ex.per_step_s >= MIN_EXCESS_S)


def straggler_cause(ex: Excess) -> str | None:
    """The part of the step with the largest excess over the other ranks; None when no part
    stands out (its own split does not say why it is late)."""
    part = max(PARTS, key=lambda p: ex.parts_s[p] - ex.others_parts_s[p])
    excess = (ex.parts_s[part] - ex.others_parts_s[part]) / ex.steps if ex.steps else 0.0
    return PARTS[part] if excess >= MIN_EXCESS_S else None


def _train_phases(data: RankData) -> list[PhaseRow]:
    return [p for p in data.phases if p["phase"] == "train"]


def _sum_of(rows: list[PhaseRow], key: Literal["disk_read_bytes"]) -> float | None:
    vals = [v for r in rows if (v := r.get(key)) is not None]
    return sum(vals) if vals else None


def _dominant_input_cause(rows: list[PhaseRow]) -> tuple[str | None, list[str]]:
    by_cause: dict[str, float] = {}
    for p in rows:
        if c := p.get("input_cause"):
            by_cause[c] = by_cause.get(c, 0.0) + p["seconds"]
    if not by_cause:
        return None, []
    cause = max(by_cause, key=by_cause.__getitem__)
    best = max((p for p in rows if p.get("input_cause") == cause), key=lambda p: p["seconds"])
    return cause, list(best.get("input_evidence") or [])


def rank_row(data: RankData, keys: Sequence[StepKey]) -> RankRow:
    """One entry of ``summary["ranks"]``, not yet compared with the other ranks (no straggler)."""
    train = _train_phases(data)
    split = StepSplit()
    for key in keys:
        split.add(data.train_steps[key])
    seconds = sum(p["seconds"] for p in train)
    images = sum(p["images"] for p in train)
    fields = split_fields(split)
    cause, evidence = _dominant_input_cause(train)
    worker_cpu = [c for p in train for c in (p.get("worker_cpu_pct") or [])]
    return {
        "rank": data.rank, "host": data.host, "local_rank": data.local_rank,
        "node_rank": data.node_rank, "status": data.status, "exit_code": data.exit_code,
        "straggler": False, "straggler_by": "busy time", "cause": None,
        "images": images, "seconds": seconds,
        "images_per_s": images / seconds if seconds > 0 else None,
        "steps_compared": split.steps,
        "data_wait_frac": fields["data_wait_frac"], "transfer_frac": fields["transfer_frac"],
        "compute_frac": fields["compute_frac"], "comm_frac": fields["comm_frac"],
        "other_frac": fields["other_frac"],
        "step_ms": _ms(split.per_step(split.wall_s)),
        "busy_ms_per_step": _ms(split.per_step(split.wall_s - split.comm_s)),
        "data_wait_ms_per_step": _ms(split.per_step(split.data_wait_s)),
        "compute_ms_per_step": _ms(split.per_step(split.compute_s)),
        "comm_ms_per_step": _ms(split.per_step(split.comm_s)),
        "workers": train[-1]["workers"] if train else None,
        "main_cpu_pct": weighted_mean(train, "main_cpu_pct"),
        "worker_cpu_pct": sum(worker_cpu) / len(worker_cpu) if worker_cpu else None,
        "host_cpu_pct": weighted_mean(train, "cpu_util_pct"),
        "disk_read_bytes": _sum_of(train, "disk_read_bytes"),
        "input_cause": cause, "input_evidence": evidence,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _others(rows: list[RankRow], k: int, key: _OthersKey) -> float | None:
    vals = [v for i, r in enumerate(rows) if i != k and (v := r.get(key)) is not None]
    return statistics.median(vals) if vals else None


def straggler_evidence(rows: list[RankRow], k: int, ex: Excess, cause: str) -> list[str]:
    """Numbers that show rank ``k`` holds the others back, and why."""
    row = rows[k]
    lines = [
        f"rank {row['rank']} is busy {fmt_ms(ex.busy_s / ex.steps)} per step against "
        f"{fmt_ms(ex.others_busy_s / ex.steps)} on the other ranks ({fmt_ratio(ex.ratio)}), the "
        f"busiest in {fmt_pct(ex.slowest_steps / ex.steps)} of {ex.steps} training steps",
        f"the other ranks wait for it in the all-reduce: "
        f"{fmt_ms(_s(_others(rows, k, 'comm_ms_per_step')))} per step against its "
        f"{fmt_ms(_s(row['comm_ms_per_step']))}",
    ]
    part = next(p for p, c in PARTS.items() if c == cause)
    lines.append(f"{part.replace('_', ' ')} {fmt_ms(ex.parts_s[part] / ex.steps)} per step against "
                 f"{fmt_ms(ex.others_parts_s[part] / ex.steps)} on the other ranks")
    return lines + _loader_lines(rows, k) if cause == "input" else lines + _cpu_lines(rows, k)


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _loader_lines(rows: list[RankRow], k: int) -> list[str]:
    """Its loader against the others': workers, CPU, disk, and its own input cause."""
    row = rows[k]
    lines = []
    # A rank without training phases has no worker count: leave it out (sorting None with
    # ints would raise).
    others_workers = sorted({w for i, r in enumerate(rows)
                             if i != k and (w := r.get("workers")) is not None})
    if row["workers"] is not None and others_workers and [row["workers"]] != others_workers:
        lines.append(f"its DataLoader workers: {row['workers']}, the others': "
                     + ", ".join(str(w) for w in others_workers))
    lines += _cpu_lines(rows, k)
    disk, others_disk = row["disk_read_bytes"], _others(rows, k, "disk_read_bytes")
    if disk is not None and others_disk is not None:
        lines.append(f"its disk reads {fmt_bytes(disk)} against {fmt_bytes(others_disk)} "
                     "on the other ranks")
    if row["input_cause"]:
        lines.append(f"its loader is limited by {row['input_cause']}: "
                     + "; ".join(row["input_evidence"]))
    return lines


def _cpu_lines(rows: list[RankRow], k: int) -> list[str]:
    row = rows[k]
    lines = []
    if row["main_cpu_pct"] is not None:
        others = _others(rows, k, "main_cpu_pct")
        tail = "" if others is None else f" (the others: {others:.0f} %)"
        lines.append(f"its training process at {row['main_cpu_pct']:.0f} % of a core{tail}")
    if row["worker_cpu_pct"] is not None:
        lines.append(f"its workers at {row['worker_cpu_pct']:.0f} % of a core each")
    if row["host_cpu_pct"] is not None:
        lines.append(f"its node's CPU {row['host_cpu_pct']:.0f} % busy")
    return lines + _cpu_inference(row)


def _cpu_inference(row: RankRow) -> list[str]:
    """Whether the slow rank's own time was CPU work: its process CPU against its busy share."""
    mine, busy, step = row["main_cpu_pct"], row["busy_ms_per_step"], row["step_ms"]
    if mine is None or not busy or not step or row.get("cause") not in ("compute", None):
        return []
    busy_pct = 100.0 * busy / step
    if mine < 0.5 * busy_pct:
        return [f"inferred: busy {busy_pct:.0f} % of every step but its process used "
                f"{mine:.0f} % of a core, so most of that time it waited on something other than "
                "its own CPU work (a slower or shared device, I/O, a lock, a sleep)"]
    return [f"inferred: busy {busy_pct:.0f} % of every step with its process at {mine:.0f} % "
            "of a core: its own CPU work (more work per step, slower or shared cores)"]


def _fill_node_cpu(rows: list[RankRow]) -> None:
    """Host CPU is sampled by local rank 0 of each node: give it to that node's other ranks."""
    by_host = {r["host"]: r["host_cpu_pct"] for r in rows
               if r["host"] is not None and r["local_rank"] == 0}
    for r in rows:
        if r["host_cpu_pct"] is None:
            r["host_cpu_pct"] = by_host.get(r["host"]) if r["host"] is not None else None


def merge_ranks(readers: Sequence[RunReader]) -> MergedRanks:
    """The per-rank table (``summary["ranks"]``) and the job's verdict (``distributed``).

    Examples:
        >>> with RunReader(d) as r0, RunReader(d, db_name=rank_db_name(1)) as r1:
        ...     merged = merge_ranks([r0, r1])
        >>> [(r["rank"], r["straggler"], r["cause"]) for r in merged["ranks"]]
        [(0, False, None), (1, True, 'input')]
    """
    ranks = sorted((load_rank(r) for r in readers), key=lambda d: d.rank)
    keys = _aligned_keys(ranks)
    rows = [rank_row(d, keys) for d in ranks]
    _fill_node_cpu(rows)
    arrivals = analyze_arrivals([RankArrivals(d.rank, d.host, d.arrivals) for d in ranks])
    table = sort_steps(ranks, keys)
    for k, row in enumerate(rows):
        ex = compare_rank(ranks, k, keys, table) if len(ranks) > 1 else Excess()
        row["status"], row["exit_code"] = ranks[k].status, ranks[k].exit_code
        if arrivals is not None:
            # Arrival order names the rank the others wait for even where the all-reduce has
            # equalised busy time; the busy-time comparison then only explains why.
            row.update(arrivals["rows"][row["rank"]])
            slow, row["straggler_by"] = row["arrival_straggler"], "arrival"
        else:
            slow, row["straggler_by"] = is_straggler(ex), "busy time"
        row["straggler"] = slow
        row["cause"] = straggler_cause(ex) if slow and ex.steps else None
        row["busy_ratio_to_others"] = ex.ratio
        row["busiest_step_frac"] = ex.slowest_steps / ex.steps if ex.steps else None
        row["excess_ms_per_step"] = ex.per_step_s * 1000.0 if ex.steps else None
        evidence = [] if not slow or arrivals is None else arrival_evidence(
            row["rank"], row, arrivals["job"])
        if slow and row["cause"] is not None:
            evidence += straggler_evidence(rows, k, ex, row["cause"])
        row["straggler_evidence"] = evidence
    world = max((d.world_size for d in ranks), default=1)
    job = job_section(rows, ranks, keys, world)
    job["arrival"] = None if arrivals is None else arrivals["job"]
    job["nodes"] = nodes(rows)
    job["failed_ranks"] = [{"rank": r["rank"], "status": r["status"], "exit_code": r["exit_code"]}
                           for r in rows if r["status"] in ("failed", "interrupted")]
    return {"ranks": rows, "distributed": job}


def job_section(rows: list[RankRow], ranks: Sequence[RankData], keys: Sequence[StepKey],
                world: int) -> Distributed:
    """One verdict for the whole job, with the figures behind it."""
    present = {r["rank"] for r in rows}
    pooled = StepSplit()
    for d in ranks:
        for key in keys:
            pooled.add(d.train_steps[key])
    fields = split_fields(pooled)
    comm = [r["comm_frac"] for r in rows if r["comm_frac"] is not None]
    comm_frac = sum(comm) / len(comm) if comm else None
    stragglers = [r["rank"] for r in rows if r["straggler"]]
    verdict, text = _job_verdict(rows, stragglers, comm_frac, fields, pooled.steps)
    return {
        "world_size": world, "ranks_recorded": sorted(present),
        "missing_ranks": [k for k in range(world) if k not in present],
        "hosts": len({r["host"] for r in rows if r["host"] is not None}) or None,
        "images_per_s": sum(r["images_per_s"] or 0.0 for r in rows) or None,
        "steps_compared": len(keys), "comm_frac": comm_frac,
        "comm_ms_per_step": _mean([r["comm_ms_per_step"] for r in rows]),
        "data_wait_frac": fields["data_wait_frac"], "stragglers": stragglers,
        "verdict": verdict, "verdict_text": text, "comm_s_includes": COMM_S_INCLUDES,
    }


def _mean(vals: list[float | None]) -> float | None:
    xs = [v for v in vals if v is not None]
    return sum(xs) / len(xs) if xs else None


def _job_verdict(rows: list[RankRow], stragglers: list[int], comm_frac: float | None,
                 fields: StepSplitFields, steps: int) -> tuple[str | None, str]:
    if stragglers:
        k = stragglers[0]
        row = next(r for r in rows if r["rank"] == k)
        others_comm = _others(rows, rows.index(row), "comm_frac")
        cause = row["cause"]
        what = {"input": "data wait", "compute": "forward, backward and optimizer",
                "transfer": "host-to-device copies"}.get(cause, cause) if cause else None
        why = f" ({cause}: {what})" if cause else ""
        wait = (f"; the other ranks spend {fmt_pct(others_comm)} of every step waiting for it "
                "in the all-reduce" if others_comm else
                "; the other ranks wait for it at the all-reduce")
        return "straggler-bound", f"rank {k} is the straggler{why}{wait}"
    if comm_frac is not None and comm_frac >= COMM_BOUND_FRAC:
        return "communication-bound", (
            f"the gradient all-reduce takes {fmt_pct(comm_frac)} of every step on average, "
            "with no rank consistently slower than the others")
    v = decide_verdict(fields["data_wait_frac"], fields["transfer_frac"], fields["other_frac"],
                       steps)
    return v.verdict, (f"ranks balanced (no straggler); all-reduce {fmt_pct(comm_frac)} of a "
                       f"step; over all ranks the job is {v.verdict or 'undecided'}")


def _failure_finding(job: Distributed) -> list[Finding]:
    failed = [f for f in job.get("failed_ranks") or [] if f["status"] == "failed"]
    if not failed:
        return []
    first = failed[0]
    code = first["exit_code"]
    how = ("its exit status was not seen" if code is None else
           f"killed by signal {code - 128} (exit code {code})" if code > 128 else
           f"exit code {code}")
    stopped = [f["rank"] for f in job["failed_ranks"] if f["status"] == "interrupted"]
    tail = f"; ranks {', '.join(map(str, stopped))} stopped after it" if stopped else ""
    return [{
        "id": f"rank{first['rank']}-failed", "severity": "high",
        "title": f"Rank {first['rank']} failed and ended the job",
        "evidence": f"rank {first['rank']}'s process ended first, {how}{tail} (how each rank's "
                    "process ended, as the watch saw it); every rank's records up to then kept",
        "fix": "read that rank's output for its error; a signal 9 with no error is often the "
               "kernel's out-of-memory killer (dmesg)",
        "expected_gain": None, "measure": "rerun; every rank should end completed",
    }]


def rank_findings(merged: MergedRanks) -> list[Finding]:
    """Findings (``summary["findings"]`` entries) for stragglers and communication."""
    out = _failure_finding(merged["distributed"])
    for row in merged["ranks"]:
        if not row["straggler"]:
            continue
        excess_s = (row["excess_ms_per_step"] or 0.0) / 1000.0
        step_s = (row["step_ms"] or 0.0) / 1000.0
        gain = step_s / (step_s - excess_s) if step_s > excess_s > 0 else None
        out.append({
            "id": f"straggler-rank{row['rank']}", "severity": "high",
            "title": f"Rank {row['rank']} holds every rank back"
                     + (f" ({row['cause']})" if row["cause"] else ""),
            "evidence": "; ".join(row["straggler_evidence"]), "fix": _straggler_fix(row),
            "expected_gain": None if gain is None else f"~{fmt_ratio(gain)} faster steps for "
            "the whole job if this rank kept pace with the others",
            "measure": "rerun and compare the ranks' busy time per step in summary.json ranks",
        })
    job = merged["distributed"]
    if job["verdict"] == "communication-bound":
        out.append({
            "id": "communication", "severity": "medium",
            "title": "Gradient all-reduce is a large part of every step",
            "evidence": job["verdict_text"],
            "fix": "more images per rank per step (larger batch) so each all-reduce serves more "
                   "work, fewer trainable parameters, or a faster interconnect (NCCL over "
                   "NVLink/InfiniBand rather than gloo over TCP)",
            "expected_gain": None, "measure": "rerun and compare comm_frac",
        })
    return out


def _straggler_fix(row: RankRow) -> str:
    if row["cause"] == "input":
        return ("give this rank's input pipeline what the others have: the same DataLoader "
                "workers and augmentation backend, its data on storage as fast as theirs (or in "
                "its node's page cache), and a node not shared with other CPU-heavy jobs")
    if row["cause"] == "compute":
        return ("check this rank's device and node: a slower or shared GPU/CPU, other processes "
                "on its cores, or fewer threads than the others")
    return "compare this rank's configuration and node with the others'"


def _holds_rank0(run_dir: Path) -> bool:
    """Whether ``run.db`` is rank 0's store. A multi-node watch on a node without rank 0 keeps
    its command's system picture there, and says which ranks it saw (``watch.ranks``)."""
    with RunReader(run_dir) as reader:
        seen = _fact_value(reader.facts(), "watch.ranks")
    return not isinstance(seen, list) or 0 in seen


def add_rank_stores(summary: Summary, run_dir: Path) -> None:
    """Merge ``run_dir``'s per-rank stores into ``summary`` (no-op without them)."""
    names = find_rank_stores(run_dir)
    if not names:
        return
    primary = [RunDir(Path(run_dir)).db.name] if _holds_rank0(run_dir) else []
    from stepscope.analysis import rankscale  # only for runs with many ranks

    if len(names) + 1 > rankscale.ROLLUP_ABOVE_RANKS:
        # Bounded build time for big jobs: per-rank roll-ups, not every step of every rank.
        merged = rankscale.rollup_merge(Path(run_dir), [*primary, *names])
        summary["ranks"] = merged["ranks"]
        summary["distributed"] = merged["distributed"]
        return
    readers = [RunReader(run_dir, db_name=n) for n in [*primary, *names]]
    try:
        merged = merge_ranks(readers)
    finally:
        for r in readers:
            r.close()
    summary["ranks"] = merged["ranks"]
    summary["distributed"] = merged["distributed"]
    summary["findings"] = rank_findings(merged) + list(summary.get("findings") or [])
