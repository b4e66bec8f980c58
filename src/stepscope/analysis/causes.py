"""Why an input-bound phase waits, decided from the loader's own stage timing.

Used when the phase has loader stage counters (``observe/stages.py``); otherwise
:func:`stepscope.analysis.verdicts.decide_input_cause` decides from process samples alone.
The order is the order of the checks (docs/input-causes.md):

1. ``workers`` (start-up)  non-persistent workers started again for this phase, and the first
   batch's extra wait is ≥ half of the phase's data wait: ``persistent_workers=True``.
2. ``storage``  the reads were cold (physical reads ≥ 50 % of bytes read, or the dataset < 50 %
   resident at start) *and* the loaders stalled on them: blocked off-CPU (not runnable, so not
   short of a core) ≥ 50 % of their fetch time, I/O pressure ≥ 20 %, or loaders in disk wait in
   ≥ 20 % of samples. Weighed before CPU, and not when the loaders were on a CPU ≥ 70 % of
   their time (then they were computing, whatever the disk did).
3. ``main-process``  the training process's own loader work — collate and pin-memory with
   ``workers=0``, pin-memory with workers — is ≥ 50 % of the data wait; or the workers were
   busy < 50 % of the phase and could supply ≥ 2× what the model consumes, yet the loop waited
   (the wait is the training process's: receiving batches, its loop, being scheduled).
4. ``workers``  more workers would supply what the model consumes within the cores this job may
   use (capacity model, ``analysis/capacity.py``), for a predicted gain ≥ 1.1×.
5. ``cpu``  otherwise: the job's cores cannot run more loading (the compute keeps them, or the
   loaders already fill them).

Loading *threads* (a Keras ``PyDataset(workers=N)`` without ``use_multiprocessing``) are judged
first by :func:`decide_threads_cause`: ``workers`` when they are GIL-bound (busy most of the
phase, on a CPU a small share of it, together about one core) and as many processes would gain
≥ 1.1× on the job's cores; the reads are not cold.
"""

from __future__ import annotations

from stepscope.analysis.capacity import (
    CONTENDED_FRAC,
    Capacity,
    LoaderFigures,
    PhaseFigures,
    predict_persistent,
    predict_processes,
    predict_workers,
    thread_figures,
    workers_target,
)
from stepscope.analysis.fmt import fmt_bytes, fmt_pct
from stepscope.analysis.verdicts import (
    DISK_WAIT_HIGH_FRAC,
    PSI_IO_HIGH_PCT,
    InputCause,
    InputEvidence,
    cold_reads,
)
from stepscope.policy import STEAL_NOTABLE_FRAC

STARTUP_DOMINANT_FRAC = 0.5
BLOCKED_HIGH_FRAC = 0.5
ON_CPU_HIGH_FRAC = 0.7
MAIN_PROCESS_FRAC = 0.5
IDLE_WORKERS_FRAC = 0.5  # workers inside fetches less than half the phase
IDLE_WORKERS_MARK = "workers busy"  # _idle_workers' evidence line, as its readers find it
SUPPLY_MARGIN = 2.0  # ... able to supply at least twice what the model consumes


def is_cold(ev: InputEvidence) -> bool:
    """The phase's reads came from the disk, not the page cache (``cold_reads`` found
    evidence). A dataset resident at the phase's start and end was not: the process's physical
    reads were other files then."""
    return bool(cold_reads(ev))


def _ms(s: float, n: float) -> str:
    return f"{s / n * 1000:.1f} ms" if n else "-"


def _startup(lf: LoaderFigures, cap: Capacity | None, phase: PhaseFigures
             ) -> InputCause | None:
    if lf.workers == 0 or lf.persistent or lf.wait_s <= 0 or not phase.get("repeat"):
        return None
    if lf.startup_s < STARTUP_DOMINANT_FRAC * lf.wait_s:
        return None
    pred = predict_persistent(phase, lf, cap)
    lines = [f"first batch waited {lf.startup_s * 1000:.0f} ms more than a typical one "
             f"({fmt_pct(lf.startup_s / lf.wait_s)} of the phase's data wait): "
             f"{lf.workers} non-persistent workers started again for this phase"]
    if pred is not None:
        lines.append(f"persistent_workers=True: predicted {pred.speedup:.2f}× ({pred.basis})")
    return InputCause("workers", lines)


def _storage(ev: InputEvidence, lf: LoaderFigures) -> InputCause | None:
    if not is_cold(ev) or lf.fetch_s <= 0:
        return None
    on_cpu = lf.fetch_cpu_s / lf.fetch_s
    blocked = lf.blocked_s / lf.fetch_s
    stalls: list[str] = []
    if blocked >= BLOCKED_HIGH_FRAC:
        stalls.append(f"loaders blocked off-CPU {fmt_pct(blocked)} of their fetch time "
                      f"(on a CPU {fmt_pct(on_cpu)})")
    if ev.psi_io_some_pct is not None and ev.psi_io_some_pct >= PSI_IO_HIGH_PCT:
        stalls.append(f"I/O pressure stall {ev.psi_io_some_pct:.0f} % of the time")
    if ev.disk_wait_frac is not None and ev.disk_wait_frac >= DISK_WAIT_HIGH_FRAC:
        stalls.append(f"loader processes in disk wait in {fmt_pct(ev.disk_wait_frac)} of samples")
    if not stalls or on_cpu >= ON_CPU_HIGH_FRAC:
        return None
    cold: list[str] = []
    if ev.disk_read_bytes is not None and ev.rchar_bytes:
        cold.append(f"physical reads {fmt_bytes(ev.disk_read_bytes)} of "
                    f"{fmt_bytes(ev.rchar_bytes)} read "
                    f"({fmt_pct(ev.disk_read_bytes / ev.rchar_bytes)})")
    if ev.resident_frac_start is not None:
        cold.append(f"dataset {fmt_pct(ev.resident_frac_start)} resident in the page cache "
                    "at start")
    return InputCause("storage", cold + stalls)


def _main_process(lf: LoaderFigures) -> InputCause | None:
    main_s = lf.main_pin_s + (lf.main_collate_s if lf.workers == 0 else 0.0)
    if lf.wait_s <= 0 or main_s < MAIN_PROCESS_FRAC * lf.wait_s:
        return None
    parts = []
    if lf.workers == 0 and lf.main_collate_s:
        parts.append(f"collate {_ms(lf.main_collate_s, lf.waits)}")
    if lf.main_pin_s:
        parts.append(f"pin-memory {_ms(lf.main_pin_s, lf.waits)}")
    return InputCause("main-process", [
        f"the training process spends {fmt_pct(main_s / lf.wait_s)} of its data wait on its "
        f"own loader work per step: {', '.join(parts)}",
        f"per-item loading {_ms(lf.stage_s.get('item', 0.0) + _item_stages(lf), lf.items)} "
        "an image"])


def _idle_workers(lf: LoaderFigures, cap: Capacity | None,
                  phase: PhaseFigures) -> InputCause | None:
    """Workers mostly idle and able to supply far more than the model takes, yet the loop
    waited: the wait is the training process's own (receiving batches, being scheduled)."""
    seconds = phase.get("seconds")
    if lf.workers == 0 or cap is None or not lf.worker_busy_s or not isinstance(
            seconds, (int, float)) or seconds <= 0:
        return None
    busy = sum(lf.worker_busy_s) / (len(lf.worker_busy_s) * seconds)
    supply, consume = cap.loader_images_per_s, cap.consume_images_per_s
    if busy >= IDLE_WORKERS_FRAC or supply is None or consume is None \
            or supply < SUPPLY_MARGIN * consume:
        return None
    return InputCause("main-process", [
        f"{lf.workers} {IDLE_WORKERS_MARK} {fmt_pct(busy)} of the phase and able to supply "
        f"{supply:,.0f} img/s against {consume:,.0f} consumed, yet the loop waited: the wait is "
        "in the training process (receiving each batch from a worker, its own loop overhead, "
        "or waiting to be scheduled)",
        _cores_line(cap)])


def receiving_was_the_wait(evidence: list[str] | None) -> bool:
    """A ``main-process`` cause decided by ``_idle_workers`` (workers idle, the training
    process slow to take their batches), not by the collate and pin-memory it did itself."""
    return any(IDLE_WORKERS_MARK in line for line in evidence or [])


def decide_idle_processes_cause(lf: LoaderFigures, cap: Capacity | None,
                                phase: PhaseFigures) -> InputCause | None:
    """``main-process`` for worker processes mostly idle while the loop waited (the one
    stage-based cause a Keras run's worker processes get besides the GIL's): the wait is the
    training process taking each batch from them. None for threads or without the figures."""
    return None if lf.worker_threads else _idle_workers(lf, cap, phase)


def _item_stages(lf: LoaderFigures) -> float:
    return sum(lf.stage_s.get(k, 0.0) for k in ("read", "decode", "transform"))


def _cores_line(cap: Capacity) -> str:
    line = "this job may use " + ("-" if cap.job_cores is None else f"{cap.job_cores:g}") + \
        " cores (affinity, cgroup quota)"
    got = cap.obtainable_cores
    if got is not None and cap.job_cores is not None and got < cap.job_cores - 0.25:
        if cap.steal_frac < STEAL_NOTABLE_FRAC:
            line += (f", but the host's other processes left it {got:.1f} (its own CPU plus "
                     "the host's idle time)")
        else:
            line += (f", but the hypervisor's other guests (steal, {fmt_pct(cap.steal_frac)} of "
                     f"this VM's CPU time) and any other processes left it {got:.1f}")
    if cap.cpu_images_per_s is None or cap.model_cpu_s_per_image is None:
        return line
    return (f"{line}: at {cap.model_cpu_s_per_image * 1000:.1f} ms of model CPU and "
            f"{(cap.cpu_s_per_image or 0.0) * 1000:.1f} ms of loading CPU per image they run at "
            f"most {cap.cpu_images_per_s:.0f} img/s; the phase ran at "
            f"{cap.now_images_per_s:.0f} img/s")


def _capacity_line(cap: Capacity, lf: LoaderFigures) -> str:
    per = cap.per_loader_images_per_s
    cpu = (cap.cpu_s_per_image or 0.0) * 1000
    return (f"one loader supplies {per or 0:.0f} img/s ({cpu:.1f} ms CPU per image); "
            f"{max(lf.workers, 1)} supply {cap.loader_images_per_s or 0:.0f} img/s; "
            f"the model consumes {cap.consume_images_per_s or 0:.0f} img/s")


def _workers_or_cpu(lf: LoaderFigures, cap: Capacity) -> InputCause:
    lines = [_capacity_line(cap, lf), _cores_line(cap)]
    if lf.fetch_s > 0 and lf.fetch_runq_s / lf.fetch_s >= CONTENDED_FRAC:
        lines.append(f"loaders waited for a free core {fmt_pct(lf.fetch_runq_s / lf.fetch_s)} of "
                     "their fetch time (other processes share these cores): gains may be smaller")
    target = workers_target(cap, lf)
    if target is not None:
        pred = predict_workers(cap, lf, target)
        if pred is not None:
            lines.append(f"num_workers {lf.workers} → {target}: predicted {pred.speedup:.2f}× "
                         f"({pred.images_per_s:.0f} img/s)")
        return InputCause("workers", lines)
    lines.append("more workers cannot help: the job's cores are taken")
    return InputCause("cpu", lines)


def decide_cause_from_stages(ev: InputEvidence, lf: LoaderFigures, cap: Capacity | None,
                             phase: PhaseFigures) -> InputCause | None:
    """The input cause from stage timing; None when the figures cannot decide."""
    for found in (_startup(lf, cap, phase), _storage(ev, lf), _main_process(lf),
                  _idle_workers(lf, cap, phase)):
        if found is not None:
            return found
    if cap is None:
        return None
    return _workers_or_cpu(lf, cap)


def decide_threads_cause(ev: InputEvidence, lf: LoaderFigures, cap: Capacity | None,
                         phase: PhaseFigures) -> InputCause | None:
    """``workers`` for loading threads that take turns holding the GIL while the job has cores
    for processes (each thread's wall and CPU time per batch); None otherwise."""
    seconds = phase.get("seconds")
    tf = None if cap is None else thread_figures(lf, seconds, cap.steal_frac)
    if tf is None or cap is None or is_cold(ev):
        return None
    pred = predict_processes(cap, lf, seconds)
    if pred is None:
        return None
    busy = ", ".join(fmt_pct(b) for b in tf.busy_frac)
    cpu = ", ".join(fmt_pct(c) for c in tf.cpu_frac)
    lines = [
        f"{len(tf.busy_frac)} loading threads inside __getitem__ {busy} of the phase but on a "
        f"CPU only {cpu} of it, asleep {fmt_pct(tf.asleep_frac)} of their busy time (each "
        f"thread's wall, CPU and run-queue time per batch, timed on the thread): together "
        f"{tf.cores_used:.2f} of a core, as Python holding the GIL runs one thread at a time",
        f"use_multiprocessing=True: predicted {pred.speedup:.2f}× ({pred.images_per_s:.0f} img/s; "
        f"{pred.basis})"]
    if lf.fetch_s > 0 and lf.fetch_runq_s / lf.fetch_s >= CONTENDED_FRAC:
        lines.append(f"the threads also waited for a free core {fmt_pct(lf.fetch_runq_s / lf.fetch_s)}"
                     " of their busy time (other processes share these cores): gains may be "
                     "smaller")
    if cap.steal_frac >= STEAL_NOTABLE_FRAC:
        lines.append(f"the hypervisor ran other guests on this VM's cores "
                     f"{fmt_pct(cap.steal_frac)} of the time (steal): the threads' CPU is counted "
                     "with the share of it they lost so")
    return InputCause("workers", lines)
