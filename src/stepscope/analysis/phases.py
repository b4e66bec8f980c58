"""Per-phase figures: the step split, throughput, I/O deltas, residency, CPU and GPU.

Everything here comes from one phase row, its steps, and the samples inside its time window.
Step fractions use steady-state steps only (warm-up excluded); when a phase has no steady-state
step but has warm-up steps, those are used and the phase is flagged ``steady: false``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stepscope import policy
from stepscope.analysis.capacity import (
    Capacity,
    LoaderFigures,
    build_capacity,
    loader_figures,
    predict_processes,
    predictions,
    thread_figures,
    workers_curve,
)
from stepscope.analysis.causes import (
    decide_cause_from_stages,
    decide_idle_processes_cause,
    decide_threads_cause,
    is_cold,
)
from stepscope.analysis.contracts_summary import (
    LoaderRow,
    PhaseRow,
    StepSplitFields,
)
from stepscope.analysis.samples import SampleCache
from stepscope.analysis.spans import covered_s
from stepscope.analysis.verdicts import (
    MIN_STEADY_STEPS,
    InputEvidence,
    Verdict,
    decide_input_cause,
    decide_verdict,
    gpu_cross_check,
)
from stepscope.store.queries import StepTotals
from stepscope.store.records import PhaseRecord, ProcessInfo, StepRecord

# As observe/stages.py: a wait over 1 ms means the step found no batch ready.
NOT_READY_S = 0.001
OUTLIER_FACTOR = 10.0
OUTLIER_MAX_FRAC = 0.05
OUTLIER_MIN_STEPS = 10


@dataclass
class StepSplit:
    """Sums over a set of steps (seconds, images)."""

    steps: int = 0
    images: int = 0
    wall_s: float = 0.0
    data_wait_s: float = 0.0
    transfer_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    other_s: float = 0.0
    outlier_steps: int = 0
    outlier_s: float = 0.0

    def add(self, s: StepRecord) -> None:
        self.steps += 1
        self.images += s.images
        self.wall_s += s.wall_s
        self.data_wait_s += s.data_wait_s
        self.transfer_s += s.transfer_s
        self.compute_s += s.compute_s
        self.comm_s += s.comm_s
        self.other_s += s.other_s

    def merge(self, other: StepSplit) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def frac(self, seconds: float) -> float | None:
        return seconds / self.wall_s if self.wall_s > 0 else None

    def per_step(self, seconds: float) -> float | None:
        return seconds / self.steps if self.steps else None

    def per_image(self, seconds: float) -> float | None:
        return seconds / self.images if self.images else None


def _outliers(steps: list[StepRecord]) -> set[int]:
    """Indices of pathological steps: over ``OUTLIER_FACTOR`` × the median step, and so few
    (≤ 5 %, at least one) that they are accidents, not the phase's behaviour. One 10 s stall
    among 100 steps of 50 ms would otherwise be two thirds of the time-weighted split."""
    if len(steps) < OUTLIER_MIN_STEPS:
        return set()
    walls = sorted(s.wall_s for s in steps)
    median = walls[len(walls) // 2]
    # A phase's first step is never an outlier: its extra wait is the loader's start-up,
    # which is reported on its own (and may be the phase's real cost: non-persistent workers).
    out = {i for i, s in enumerate(steps) if s.step and s.wall_s > OUTLIER_FACTOR * median}
    return out if len(out) <= max(1, int(OUTLIER_MAX_FRAC * len(steps))) else set()


def steady_split(steps: list[StepRecord]) -> tuple[StepSplit, bool]:
    """The split over steady-state steps (:func:`stepscope.policy.steady_steps`); falls back to
    all steps (``False``) if none is steady.

    Pathological outlier steps (see :func:`_outliers`) are left out and counted instead.
    """
    chosen, steady = policy.steady_steps(steps)
    split = StepSplit()
    drop = _outliers(chosen)
    for i, s in enumerate(chosen):
        if i in drop:
            split.outlier_steps += 1
            split.outlier_s += s.wall_s
        else:
            split.add(s)
    return split, steady


@dataclass
class PhaseTotals:
    """A phase's steps: their raw records while the store keeps them all, else two sums
    (steady-state and warm-up steps) from the store's totals over raw rows and roll-ups.

    The sums are what lets a ten-million-step run be read in seconds; the raw records add the
    per-step rule (outlier steps left out, :func:`_outliers`), which needs every step's time and
    so applies to phases whose steps are all still raw (the store's recent window).
    """

    steady: StepSplit = field(default_factory=StepSplit)
    warmup: StepSplit = field(default_factory=StepSplit)
    raw: list[StepRecord] | None = None

    @classmethod
    def from_steps(cls, steps: list[StepRecord]) -> PhaseTotals:
        out = cls(raw=list(steps))
        for s in steps:
            (out.warmup if s.warmup else out.steady).add(s)
        return out

    def add_totals(self, t: StepTotals) -> None:
        split = self.warmup if t.warmup else self.steady
        split.merge(StepSplit(t.steps, t.images, t.wall_s, t.data_wait_s, t.transfer_s,
                              t.compute_s, t.comm_s, t.other_s))

    @property
    def steps(self) -> int:
        return self.steady.steps + self.warmup.steps

    def steady_split(self) -> tuple[StepSplit, bool]:
        """The steady-state split; all steps (``False``) when none is steady."""
        if self.raw is not None:
            return steady_split(self.raw)
        if self.steady.steps or not self.warmup.steps:
            return self.steady, bool(self.steady.steps)
        both = StepSplit()
        both.merge(self.steady)
        both.merge(self.warmup)
        return both, False


def totals_by_phase(totals: Iterable[StepTotals],
                    raw: dict[int, list[StepRecord]]) -> dict[int, PhaseTotals]:
    """Per phase: its raw steps when none was folded away, else the store's totals."""
    out: dict[int, PhaseTotals] = {}
    folded: set[int] = set()
    for t in totals:
        out.setdefault(t.phase_id, PhaseTotals()).add_totals(t)
        if t.rolled_steps:
            folded.add(t.phase_id)
    for phase_id in out:
        if phase_id not in folded:
            out[phase_id] = PhaseTotals.from_steps(raw.get(phase_id, []))
    return out


def split_fields(split: StepSplit) -> StepSplitFields:
    """The step split as summary keys: fractions, ms per step and ms per image."""
    compute_s = split.compute_s + split.comm_s

    def ms_step(sec: float) -> float | None:
        v = split.per_step(sec)
        return None if v is None else v * 1000.0

    def ms_image(sec: float) -> float | None:
        v = split.per_image(sec)
        return None if v is None else v * 1000.0

    return {
        "data_wait_frac": split.frac(split.data_wait_s),
        "transfer_frac": split.frac(split.transfer_s),
        "compute_frac": split.frac(compute_s),
        "comm_frac": split.frac(split.comm_s),
        "other_frac": split.frac(split.other_s),
        "outlier_steps": split.outlier_steps, "outlier_s": split.outlier_s,
        "step_ms_per_step": ms_step(split.wall_s),
        "data_wait_ms_per_step": ms_step(split.data_wait_s),
        "transfer_ms_per_step": ms_step(split.transfer_s),
        "compute_ms_per_step": ms_step(compute_s),
        "other_ms_per_step": ms_step(split.other_s),
        "data_wait_ms_per_image": ms_image(split.data_wait_s),
        "compute_ms_per_image": ms_image(compute_s),
        "step_ms_per_image": ms_image(split.wall_s),
    }


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(0, b - a)


def _overlaps(p: ProcessInfo, t0: float, t1: float) -> bool:
    return p.first_t <= t1 and p.last_t >= t0


def _process_cpu(cache: SampleCache, pid: int, t0: float, t1: float) -> float | None:
    return cache.mean(f"proc:{pid}", "cpu_util_pct", t0, t1)


def _disk_wait_frac(cache: SampleCache, pids: list[int], t0: float, t1: float) -> float | None:
    """Share of (process, sample) pairs where a loading process was in uninterruptible sleep."""
    vals: list[float] = []
    for pid in pids:
        vals += cache.get(f"proc:{pid}", "disk_wait").window(t0, t1)
    return sum(vals) / len(vals) if vals else None


def _disk_busy(cache: SampleCache, t0: float, t1: float) -> float | None:
    means = [m for src in cache.sources("busy_pct") if src.startswith("disk:")
             if (m := cache.mean(src, "busy_pct", t0, t1)) is not None]
    return max(means) if means else None


def _gpu_util(cache: SampleCache, gpu: int, t0: float, t1: float) -> float | None:
    return cache.mean(f"gpu{gpu}", "util_pct", t0, t1)


@dataclass
class PhaseContext:
    """What every phase computation needs besides its own rows."""

    cache: SampleCache
    processes: list[ProcessInfo]
    main_pid: int | None
    gpu_index: int | None
    stages: dict[int, Any] = field(default_factory=dict)  # phase id -> stages.phase fact
    cores: float | None = None  # the cores this job may use (affinity, quota)
    host_cores: int | None = None  # the host's cores (per-CPU series), to see their idle time
    seen: set[tuple[int, str]] = field(default_factory=set)  # (rank, phase) already summarized
    worker_word: str = "DataLoader worker"
    # Stage-based causes model DataLoader workers; a Keras run (whose torch backend runs a
    # DataLoader of its own, with no workers) is judged on the process samples like its other
    # backends, so one script gets one cause whatever the backend.
    stage_causes: bool = True
    # phase id -> seconds of other phases inside its window (a validation run inside an open
    # training phase: Lightning's val_check_interval < 1, mid-epoch validation by hand)
    nested_s: dict[int, float] = field(default_factory=dict)


def nested_seconds(records: list[PhaseRecord], totals: dict[int, PhaseTotals]
                   ) -> dict[int, float]:
    """For each training phase, the seconds of the union of validation phases (same rank) that
    ran inside its window (``PhaseContext.nested_s``)."""
    windows = {ph.phase_id: (*phase_window(ph, totals.get(ph.phase_id, PhaseTotals())),
                             ph.rank, ph.phase) for ph in records}
    out: dict[int, float] = {}
    for pid, (t0, t1, rank, kind) in windows.items():
        if kind != "train":
            continue
        total = covered_s(t0, t1, [(a, b) for a, b, r, k in windows.values()
                                    if k == "val" and r == rank])
        if total > 0:
            out[pid] = total
    return out


def phase_window(ph: PhaseRecord, totals: PhaseTotals) -> tuple[float, float]:
    """Start and end of a phase (end from the last step when the phase row was never closed)."""
    end = ph.ended
    if end is None:
        # Step t_start may come from a monotonic clock; only durations are comparable here.
        end = ph.started + totals.steady.wall_s + totals.warmup.wall_s
    return ph.started, end


def _worker_figures(
    ctx: PhaseContext, t0: float, t1: float, images: int
) -> tuple[list[int], list[float], float | None]:
    """Workers alive in the window, each one's mean CPU %, and loader CPU ms per image."""
    pids = [p.pid for p in ctx.processes if p.role == "worker" and _overlaps(p, t0, t1)]
    cpu: list[float] = []
    cpu_s = 0.0
    for p in ctx.processes:
        if p.pid not in pids:
            continue
        m = _process_cpu(ctx.cache, p.pid, t0, t1)
        if m is None:
            continue
        cpu.append(m)
        alive_s = min(t1, p.last_t) - max(t0, p.first_t)
        cpu_s += m / 100.0 * max(0.0, alive_s)
    per_image = cpu_s / images * 1000.0 if cpu and images else None
    return pids, cpu, per_image


def _job_cpu_pct(ctx: PhaseContext, t0: float, t1: float) -> float | None:
    """The process tree's CPU as a share of the job's cores (None without both)."""
    tree = ctx.cache.mean("tree", "cpu_util_pct", t0, t1)
    if tree is None or not ctx.cores:
        return None
    return min(100.0, tree / ctx.cores)


def _input_evidence(ph: PhaseRecord, ctx: PhaseContext, t0: float, t1: float,
                    images: int) -> tuple[InputEvidence, float | None]:
    """What the samples say about the loader in this window, and loader CPU ms per image."""
    worker_pids, worker_cpu, loader_ms = _worker_figures(ctx, t0, t1, images)
    workers = ph.workers if ph.workers is not None else len(worker_pids)
    main_cpu = None if ctx.main_pid is None else _process_cpu(ctx.cache, ctx.main_pid, t0, t1)
    loader_pids = worker_pids if workers > 0 else ([ctx.main_pid] if ctx.main_pid else [])
    ev = InputEvidence(
        workers=workers, worker_cpu_pct=worker_cpu, main_cpu_pct=main_cpu,
        host_cpu_pct=ctx.cache.mean("host", "cpu_util_pct", t0, t1),
        disk_read_bytes=_delta(ph.read_bytes_start, ph.read_bytes_end),
        rchar_bytes=_delta(ph.rchar_start, ph.rchar_end),
        resident_frac_start=ph.resident_frac_start, resident_frac_end=ph.resident_frac_end,
        psi_io_some_pct=ctx.cache.mean("host", "psi_io_some_pct", t0, t1),
        disk_wait_frac=_disk_wait_frac(ctx.cache, loader_pids, t0, t1),
        disk_busy_pct=_disk_busy(ctx.cache, t0, t1), worker_word=ctx.worker_word,
        job_cpu_pct=_job_cpu_pct(ctx, t0, t1),
        steal_pct=ctx.cache.mean("host", "steal_pct", t0, t1), job_cores=ctx.cores,
    )
    return ev, loader_ms


def _median_step_verdict(steps: list[StepRecord]) -> tuple[str | None, float]:
    """The verdict of the phase's median step (by wall time, steady steps) and its wall."""
    steady = sorted((s for s in steps if not s.warmup and s.wall_s > 0), key=lambda s: s.wall_s)
    if len(steady) < OUTLIER_MIN_STEPS:
        return None, 0.0
    m = steady[len(steady) // 2]
    v = decide_verdict(m.data_wait_s / m.wall_s, m.transfer_s / m.wall_s, m.other_s / m.wall_s,
                       MIN_STEADY_STEPS)
    return v.verdict, m.wall_s


def _phase_verdict(split: StepSplit, steady: bool, fields: StepSplitFields,
                   steps: list[StepRecord] | None = None) -> Verdict:
    verdict = decide_verdict(fields["data_wait_frac"], fields["transfer_frac"],
                             fields["other_frac"], split.steps)
    median, wall = _median_step_verdict(steps or [])
    if median is not None and verdict.verdict is not None and median != verdict.verdict:
        # The time-weighted split is carried by fewer, longer steps than the typical one: say
        # so rather than let either figure decide alone.
        extra = (f"tentative: the median step ({wall * 1000:.0f} ms) is {median}, the "
                 "time-weighted split says otherwise")
        verdict = Verdict(verdict.verdict, True,
                          extra if not verdict.note else f"{verdict.note}; {extra}")
    if not steady and split.steps:
        verdict = Verdict(verdict.verdict, True,
                          "insufficient steps: only warm-up steps were timed in this phase")
    if split.outlier_steps:
        extra = (f"{split.outlier_steps} outlier step(s) ({split.outlier_s:.2f} s, over "
                 f"{OUTLIER_FACTOR:.0f}× the median step) left out of the split")
        verdict = Verdict(verdict.verdict, verdict.weak,
                          extra if not verdict.note else f"{verdict.note}; {extra}")
    return verdict


def summarize_phase(ph: PhaseRecord, totals: PhaseTotals, ctx: PhaseContext) -> PhaseRow:
    """One entry of ``summary["phases"]`` (DESIGN.md keys plus the evidence behind them)."""
    t0, t1 = phase_window(ph, totals)
    # its own time: a validation that ran inside it is the validation's (its images/s, its rate)
    seconds = max(0.0, t1 - t0 - ctx.nested_s.get(ph.phase_id, 0.0))
    split, steady = totals.steady_split()
    images = ph.images or totals.steady.images + totals.warmup.images
    ev, loader_ms = _input_evidence(ph, ctx, t0, t1, images)
    fields = split_fields(split)
    gpu_util = None if ctx.gpu_index is None else _gpu_util(ctx.cache, ctx.gpu_index, t0, t1)
    # Per-step rules (median step, waits) apply while the phase's steps are all raw (PhaseTotals).
    verdict = gpu_cross_check(_phase_verdict(split, steady, fields, totals.raw), gpu_util)
    lf = loader_figures(_with_step_waits(ctx.stages.get(ph.phase_id), totals.raw or []))
    main_cpu = ev.main_cpu_pct
    steal = ev.steal_pct
    cap = None if lf is None else build_capacity(
        {"step_ms_per_image": fields["step_ms_per_image"],
         "data_wait_ms_per_image": fields["data_wait_ms_per_image"],
         "main_cpu_pct": main_cpu, "seconds": seconds, "images": images,
         "tree_cpu_pct": ctx.cache.mean("tree", "cpu_util_pct", t0, t1),
         "host_cpu_pct": ev.host_cpu_pct, "host_cores": ctx.host_cores,
         "steal_pct": steal},
        lf, ctx.cores, is_cold(ev))
    # A loader's workers can only be kept from a previous phase of the same kind.
    repeat = (ph.rank, ph.phase) in ctx.seen
    ctx.seen.add((ph.rank, ph.phase))
    cause = None
    if verdict.verdict == "input-bound":
        if lf is not None and lf.worker_threads:
            cause = decide_threads_cause(ev, lf, cap, {"seconds": seconds, "images": images})
        if cause is None and lf is not None and ctx.stage_causes:
            cause = decide_cause_from_stages(ev, lf, cap, {"seconds": seconds, "images": images,
                                                           "repeat": repeat})
        elif cause is None and lf is not None:  # a Keras PyDataset's worker processes
            cause = decide_idle_processes_cause(lf, cap, {"seconds": seconds, "images": images})
        cause = cause or decide_input_cause(ev)
    disk, rchar = ev.disk_read_bytes, ev.rchar_bytes
    return {
        "phase_id": ph.phase_id, "epoch": ph.epoch, "phase": ph.phase, "rank": ph.rank,
        "started": t0, "ended": t1,
        "steps": ph.steps or totals.steps, "steady_steps": split.steps if steady else 0,
        "warmup_steps": totals.warmup.steps, "warmup_s": totals.warmup.wall_s,
        "images": images, "seconds": seconds,
        "images_per_s": images / seconds if seconds > 0 else None,
        **fields,
        "verdict": verdict.verdict, "verdict_weak": verdict.weak, "verdict_note": verdict.note,
        "input_cause": cause.cause if cause else None,
        "input_evidence": cause.evidence if cause else [],
        "disk_read_bytes": disk,
        "cache_read_bytes": None if disk is None or rchar is None else max(0, rchar - disk),
        "rchar_bytes": rchar,
        "disk_read_rate_bytes_per_s": disk / seconds if disk is not None and seconds else None,
        "dataset_resident_frac_start": ph.resident_frac_start,
        "dataset_resident_frac_end": ph.resident_frac_end,
        "cpu_util_pct": ev.host_cpu_pct, "steal_pct": steal, "job_cpu_pct": ev.job_cpu_pct,
        "cpu_util_max_pct": ctx.cache.peak("host", "cpu_util_pct").max(t0, t1),
        "main_cpu_pct": ev.main_cpu_pct, "workers": ev.workers,
        "worker_cpu_pct": ev.worker_cpu_pct, "loader_cpu_ms_per_image": loader_ms,
        "psi_io_some_pct": ev.psi_io_some_pct, "disk_wait_frac": ev.disk_wait_frac,
        "disk_busy_pct": ev.disk_busy_pct,
        "gpu_util_pct": gpu_util,
        "loader": _loader_row(lf, cap, seconds),
        "capacity": None if cap is None else cap.to_dict(),
        "predictions": [] if lf is None or cap is None else predictions(
            lf, cap, {"seconds": seconds, "images": images, "repeat": repeat}),
        "workers_curve": {} if lf is None or cap is None else workers_curve(cap, lf),
    }


def _with_step_waits(fact: Any, steps: list[StepRecord]) -> Any:
    """``watch`` records the waits as steps only: fill the loop-side figures from them; and
    the start-up from the steps in either case."""
    if not isinstance(fact, dict) or not steps:
        return fact
    waits = [s.data_wait_s for s in steps]
    out = {**fact, "startup_from_steps_s": _startup_s(waits, fact.get("loader_workers"))}
    if "waits" in fact:
        return out
    return {**out, "waits": len(waits), "wait_s": sum(waits), "first_wait_s": waits[0],
            "not_ready_steps": sum(1 for w in waits if w > NOT_READY_S)}


def _startup_s(waits: list[float], workers: Any) -> float | None:
    """The waits of the first batches beyond a typical wait: each of ``workers`` new workers
    delivers its first batch only once it has started, so the first ``workers`` waits carry it."""
    k = max(1, int(workers or 0))
    if len(waits) <= k + 1:
        return None
    rest = sorted(waits[k:])
    typical = rest[len(rest) // 2]
    return sum(max(0.0, w - typical) for w in waits[:k])


def _loader_row(lf: LoaderFigures | None, cap: Capacity | None, seconds: float
                ) -> LoaderRow | None:
    """The loader's own figures: stage ms per image, worker busy share, batches not ready."""
    if lf is None:
        return None
    alive = seconds * len(lf.worker_busy_s)
    threads = thread_figures(lf, seconds, cap.steal_frac if cap else 0.0)
    gil = None if cap is None else predict_processes(cap, lf, seconds)
    return {
        "workers": lf.workers, "persistent_workers": lf.persistent, "items": lf.items,
        "stage_ms_per_image": cap.stage_ms_per_image if cap else None,
        "read_bytes_per_image": lf.read_bytes / lf.items if lf.items else None,
        "worker_busy_s": lf.worker_busy_s,
        "worker_busy_frac": sum(lf.worker_busy_s) / alive if alive > 0 else None,
        "not_ready_frac": lf.not_ready / lf.waits if lf.waits else None,
        "first_wait_s": lf.first_wait_s, "startup_s": lf.startup_s,
        "wait_cpu_frac": lf.wait_cpu_s / lf.wait_s if lf.wait_s > 0 else None,
        "fetch_on_cpu_frac": lf.fetch_cpu_s / lf.fetch_s if lf.fetch_s > 0 else None,
        "fetch_runq_frac": lf.fetch_runq_s / lf.fetch_s if lf.fetch_s > 0 else None,
        "fetch_blocked_frac": lf.blocked_s / lf.fetch_s if lf.fetch_s > 0 else None,
        "worker_threads": lf.worker_threads,
        "worker_cpu_s": lf.worker_cpu_s,
        "threads_gil_bound": None if threads is None else threads.gil_bound,
        "processes_prediction": None if gil is None else {
            "change": gil.change, "images_per_s": gil.images_per_s, "speedup": gil.speedup,
            "basis": gil.basis},
    }
