"""Verdicts: what limits a phase, and when input-bound, why.

A step is split into data wait, host-to-device copy (transfer), compute (forward, backward,
optimizer, plus any separately timed all-reduce) and other (the rest of the loop body). The
verdict names the part that holds the loop back:

- ``input-bound``    data wait ≥ 20 % of the steady-state step time and the largest of the
  non-compute parts. 20 % is where the TensorFlow profiler says "HIGHLY input-bound" and TraceML
  raises INPUT_BOUND "critical"; 5 % (TF's "moderately") is reported as a finding, not a verdict.
- ``transfer-bound`` host-to-device copy ≥ 20 % and the largest non-compute part.
- ``overhead-bound`` the rest of the loop body (logging, metrics, Python, ``.item()`` syncs)
  ≥ 20 % and the largest non-compute part.
- ``compute-bound``  otherwise: no non-compute part reaches 20 % and together they take less
  than half the step. When they take half or more (three parts at 19 %), the largest is named
  and the verdict is *tentative*; so is one decided by a part within 3 points of 20 %.

Fractions come from steady-state steps only (warm-up steps excluded). Fewer than
``MIN_STEADY_STEPS`` (20, TraceML's minimum before it warns) makes the verdict *weak*: it is
still given, flagged, with the reason "insufficient steps".

The input cause, decided from the evidence in this order (each threshold below):

1. ``cpu``      the loader's CPU is saturated: DataLoader workers average ≥ 85 % of a core each,
   or the host's cores average ≥ 90 % busy (more workers cannot help then), or, with
   ``workers == 0``, the training process itself is ≥ 85 % of a core (it decodes and augments
   between steps). On a VM these bounds are of what the hypervisor left it (× ``1 - steal``,
   ``policy.unstolen``): a process stopped while it ran other guests reads less than a core.
2. ``storage``  the phase read from disk (physical reads ≥ 50 % of the bytes the process read,
   or the dataset < 50 % page-cache resident at phase start) *and* the loaders stalled on it:
   pressure-stall I/O ≥ 20 %, loader processes in disk wait (state D) in ≥ 20 % of samples,
   the disk ≥ 80 % busy, or the workers idle (< 50 % of a core) while the loop waited.
3. ``cpu``      a loader that already runs a worker for each of the job's cores (a tf.data map
   at ``AUTOTUNE``, a PyDataset's ``workers``), with the job's cores ≥ 60 % busy: more workers
   would share the same cores (``policy.more_workers`` adds none), so the work a batch costs is
   the limit. Saturated pipelines' sampled CPU read 66-96 % over sub-second phases (the tf.data
   guide's TFRecord decode, a PyDataset decoding JPEGs with PIL in two worker processes), which
   left their phases flipping between ``cpu`` and ``workers`` around 90 %; under 60 % the
   workers wait on something else than their CPU.
4. ``workers``  workers exist, are not saturated and are not waiting on the disk, yet the loop
   waits: too few workers or too little prefetch. Also ``workers == 0`` (loading inline in the
   training process, which may be saturated) while the job's cores, as measured, are < 90 %
   busy: worker processes would load on the cores it leaves idle (the stage-timed analysis,
   analysis/causes.py, says the same).
5. ``cpu``      ``workers == 0`` without storage evidence nor a measured spare core: loading runs
   inline in the training process, so its CPU work is the wait (by elimination; said so in the
   evidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stepscope.analysis.fmt import fmt_bytes, fmt_count, fmt_pct
from stepscope.policy import STEAL_NOTABLE_FRAC, unstolen

BOUND_FRAC = 0.20
# Non-compute parts that together take half the step make the model's work the minority.
NON_COMPUTE_MAJORITY_FRAC = 0.50
# A verdict decided by a part within 3 points of the threshold could flip on a rerun (run-to-run
# spread of a phase's data-wait share on a shared machine is a few points): say so.
NEAR_THRESHOLD_FRAC = 0.03
INPUT_MODERATE_FRAC = 0.05
MIN_STEADY_STEPS = 20

WORKER_SATURATED_PCT = 85.0
CORES_BUSY_PCT = 90.0
# ... enough, where the loader has a worker on each core: saturated pipelines' sampled CPU
# read 66-96 % over sub-second phases (warm-up, a batch's hand-off, the sampling's grain)
CORES_MOSTLY_BUSY_PCT = 60.0
PHYS_READ_HIGH_FRAC = 0.5
# Physical reads below this are shared libraries paged in by new workers, not the dataset: a
# ratio over them means nothing (12 MB of page-ins against 415 kB read is "2821 %").
COLD_MIN_READ_BYTES = 16_000_000
RESIDENT_LOW_FRAC = 0.5
# The dataset's files in the page cache at a phase's start and at its end: its physical reads
# were other files (libraries a first step pages in, a checkpoint), not the dataset's.
RESIDENT_HIGH_FRAC = 0.9
PSI_IO_HIGH_PCT = 20.0
DISK_WAIT_HIGH_FRAC = 0.2
DISK_BUSY_HIGH_PCT = 80.0
WORKER_IDLE_PCT = 50.0

VERDICTS = ("input-bound", "compute-bound", "transfer-bound", "overhead-bound")
INPUT_CAUSES = ("storage", "cpu", "workers", "main-process")


@dataclass(frozen=True)
class Verdict:
    """The verdict of one phase; ``weak`` when too few steady-state steps back it."""

    verdict: str | None
    weak: bool
    note: str | None


def decide_verdict(
    data_wait_frac: float | None,
    transfer_frac: float | None,
    other_frac: float | None,
    steady_steps: int,
) -> Verdict:
    """Name the part of the step that bounds the loop.

    Examples:
        >>> decide_verdict(0.62, 0.01, 0.02, 100).verdict
        'input-bound'
        >>> decide_verdict(0.03, 0.01, 0.02, 5).weak
        True
    """
    if steady_steps == 0 or data_wait_frac is None:
        return Verdict(None, True, "insufficient steps: no timed steps in this phase")
    parts = {
        "input-bound": data_wait_frac,
        "transfer-bound": transfer_frac or 0.0,
        "overhead-bound": other_frac or 0.0,
    }
    worst = max(parts, key=parts.__getitem__)
    verdict = worst if parts[worst] >= BOUND_FRAC else "compute-bound"
    notes: list[str] = []
    outside = sum(parts.values())
    if verdict == "compute-bound" and outside >= NON_COMPUTE_MAJORITY_FRAC:
        # No single part reaches 20 %, but together they take most of the step: the model's
        # own work is the minority, so "compute-bound" would be false. Name the largest.
        verdict = worst
        notes.append(f"tentative: no single part reaches {fmt_pct(BOUND_FRAC)} but together "
                     f"they take {fmt_pct(outside)} of the step; the largest is named")
    elif abs(parts[worst] - BOUND_FRAC) < NEAR_THRESHOLD_FRAC:
        notes.append(f"tentative: the largest part ({fmt_pct(parts[worst])}) is within "
                     f"{fmt_pct(NEAR_THRESHOLD_FRAC)} of the {fmt_pct(BOUND_FRAC)} threshold")
    if steady_steps < MIN_STEADY_STEPS:
        notes.insert(0,
            f"insufficient steps: {steady_steps} steady-state steps, "
            f"{MIN_STEADY_STEPS} needed for a firm verdict"
        )
    if notes:
        return Verdict(verdict, True, "; ".join(notes))
    return Verdict(verdict, False, None)


GPU_BUSY_PCT = 90.0


def gpu_cross_check(v: Verdict, gpu_util_pct: float | None) -> Verdict:
    """Never input-bound while NVML says the GPU ran kernels ≥ 90 % of the phase.

    On a GPU the CPU's data wait can overlap kernels still queued from the previous step: the
    loop "waits" while the GPU is busy, and more workers would gain nothing. The GPU-true split
    (watch's and Monitor's CUDA events) already books that overlap as compute; this check
    catches a split timed without events. NVML's figure is "a kernel was running", so a busy
    reading is evidence the GPU was not starved, not a measure of how busy it was.

    Examples:
        >>> gpu_cross_check(Verdict("input-bound", False, None), 97.0).verdict
        'compute-bound'
    """
    if v.verdict != "input-bound" or gpu_util_pct is None or gpu_util_pct < GPU_BUSY_PCT:
        return v
    note = (f"the loop waited for data, but NVML shows the GPU running kernels "
            f"{gpu_util_pct:.0f} % of the phase (≥ {GPU_BUSY_PCT:.0f} %): the wait overlapped "
            "queued GPU work, so it is not input-bound")
    return Verdict("compute-bound", True, note if not v.note else f"{v.note}; {note}")


@dataclass
class InputEvidence:
    """What the samples say about the loader during one phase (None: not measured)."""

    workers: int
    worker_cpu_pct: list[float] = field(default_factory=list)
    main_cpu_pct: float | None = None
    host_cpu_pct: float | None = None
    disk_read_bytes: int | None = None
    rchar_bytes: int | None = None
    resident_frac_start: float | None = None
    resident_frac_end: float | None = None
    psi_io_some_pct: float | None = None
    disk_wait_frac: float | None = None
    disk_busy_pct: float | None = None
    worker_word: str = "DataLoader worker"  # the framework's name for one (analysis/vocab.py)
    # The job's own CPU (its process tree) as a share of the cores it may use. When known it,
    # not the host's figure, says whether the job's cores are saturated: on a shared machine
    # other people's processes keep the host busy while this job has a core to spare.
    job_cpu_pct: float | None = None
    # A VM's stolen share of the CPU time (``host`` ``steal_pct``): a process's CPU cannot
    # reach a whole core, nor the job's its cores, by that much (policy.unstolen).
    steal_pct: float | None = None
    job_cores: float | None = None  # the cores this job may use (affinity, quota)


@dataclass(frozen=True)
class InputCause:
    """The cause of input-boundness and the evidence lines (numbers) that decided it."""

    cause: str
    evidence: list[str]


def _stolen(ev: InputEvidence) -> str:
    """The clause naming a VM's steal, when it is worth naming ('' otherwise)."""
    if 1.0 - unstolen(ev.steal_pct) < STEAL_NOTABLE_FRAC:
        return ""
    return (f" (the hypervisor ran other guests {ev.steal_pct:.0f} % of this VM's CPU time: "
            "steal)")


def _cpu_saturated(ev: InputEvidence) -> list[str]:
    """Evidence lines if the loader's CPU is the limit, else []."""
    lines: list[str] = []
    left = unstolen(ev.steal_pct)  # of each core, what the hypervisor left this VM
    if ev.workers > 0 and ev.worker_cpu_pct:
        mean = sum(ev.worker_cpu_pct) / len(ev.worker_cpu_pct)
        if mean >= WORKER_SATURATED_PCT * left:
            each = ", ".join(f"{p:.0f} %" for p in ev.worker_cpu_pct)
            n = fmt_count(len(ev.worker_cpu_pct), ev.worker_word)
            lines.append(f"{n} at {each} of a core{_stolen(ev)}")
    if ev.workers == 0 and ev.main_cpu_pct is not None and _spare_core(ev) is None \
            and ev.main_cpu_pct >= WORKER_SATURATED_PCT * left:
        lines.append(
            f"workers=0: the training process loads inline at {ev.main_cpu_pct:.0f} % of a "
            f"core{_stolen(ev)}")
    if ev.job_cpu_pct is not None:
        if ev.job_cpu_pct >= CORES_BUSY_PCT * left and not _loaders_in_disk_wait(ev):
            lines.append(f"the job's cores busy: its processes used {ev.job_cpu_pct:.0f} % of "
                         f"the cores it may use{_stolen(ev)}")
    elif ev.host_cpu_pct is not None and ev.host_cpu_pct >= CORES_BUSY_PCT \
            and not _loaders_in_disk_wait(ev):
        lines.append(f"all cores busy: host CPU {ev.host_cpu_pct:.0f} % on average")
    return lines


def _workers_at_cores(ev: InputEvidence) -> str | None:
    """The evidence line that the loader already has a worker on each of the job's cores and
    the cores were mostly busy (more workers would share them), None otherwise."""
    left = unstolen(ev.steal_pct)
    if not ev.job_cores or ev.workers < ev.job_cores or ev.job_cpu_pct is None \
            or ev.job_cpu_pct < CORES_MOSTLY_BUSY_PCT * left or _loaders_in_disk_wait(ev):
        return None
    return (f"{fmt_count(ev.workers, ev.worker_word)} already, one for each of the job's "
            f"{ev.job_cores:g} cores (the job used {ev.job_cpu_pct:.0f} % of them"
            f"{_stolen(ev)}): more would share the same cores")


def _spare_core(ev: InputEvidence) -> str | None:
    """The evidence line that the job's cores were not all busy (its own CPU, else the host's),
    None when they were or nothing measured it."""
    left = unstolen(ev.steal_pct)
    if ev.job_cpu_pct is not None:
        return (f"the job used {ev.job_cpu_pct:.0f} % of its cores (cores to spare){_stolen(ev)}"
                if ev.job_cpu_pct < CORES_BUSY_PCT * left else None)
    if ev.host_cpu_pct is not None and ev.host_cpu_pct < CORES_BUSY_PCT:
        return f"host CPU {ev.host_cpu_pct:.0f} % (cores to spare)"
    return None


def _loaders_in_disk_wait(ev: InputEvidence) -> bool:
    """Loader processes asleep on the disk are not short of CPU: busy cores (other processes
    on a shared machine) are then beside the point, whatever the host's figure."""
    return ev.disk_wait_frac is not None and ev.disk_wait_frac >= DISK_WAIT_HIGH_FRAC


def stayed_resident(marks: list[float | None]) -> bool:
    """The dataset's residency (``mincore``), read at each of a window's phase starts and ends,
    was measured and high every time: whatever the process read from the disk meanwhile was
    other files.

    Examples:
        >>> stayed_resident([1.0, 0.98]), stayed_resident([1.0, None]), stayed_resident([])
        (True, False, False)
    """
    return bool(marks) and all(m is not None and m >= RESIDENT_HIGH_FRAC for m in marks)


def dataset_stayed_resident(ev: InputEvidence) -> bool:
    """The dataset's files were in the page cache at the phase's start and at its end."""
    return stayed_resident([ev.resident_frac_start, ev.resident_frac_end])


def cold_reads(ev: InputEvidence) -> list[str]:
    """The evidence that the phase's reads came from the disk, not the page cache: physical
    reads of 16 MB or more and half of what was read, or the dataset under half resident at the
    start; none while the dataset stayed resident (``dataset_stayed_resident``). Empty: warm."""
    lines: list[str] = []
    if dataset_stayed_resident(ev):
        return lines  # the physical reads were not the dataset's: no cold cache to name
    if ev.disk_read_bytes is not None and ev.rchar_bytes \
            and ev.disk_read_bytes >= COLD_MIN_READ_BYTES:
        ratio = ev.disk_read_bytes / ev.rchar_bytes
        if ratio >= PHYS_READ_HIGH_FRAC:
            lines.append(
                f"physical reads {fmt_bytes(ev.disk_read_bytes)} of {fmt_bytes(ev.rchar_bytes)} "
                f"read ({fmt_pct(ratio)})"
            )
    if ev.resident_frac_start is not None and ev.resident_frac_start < RESIDENT_LOW_FRAC:
        lines.append(f"dataset {fmt_pct(ev.resident_frac_start)} resident in the page cache at start")
    return lines


def _stalled(ev: InputEvidence) -> list[str]:
    lines: list[str] = []
    if ev.psi_io_some_pct is not None and ev.psi_io_some_pct >= PSI_IO_HIGH_PCT:
        lines.append(f"I/O pressure stall {ev.psi_io_some_pct:.0f} % of the time")
    if ev.disk_wait_frac is not None and ev.disk_wait_frac >= DISK_WAIT_HIGH_FRAC:
        lines.append(f"loader processes in disk wait in {fmt_pct(ev.disk_wait_frac)} of samples")
    if ev.disk_busy_pct is not None and ev.disk_busy_pct >= DISK_BUSY_HIGH_PCT:
        lines.append(f"disk {ev.disk_busy_pct:.0f} % busy")
    loader_cpu = _loader_cpu_pct(ev)
    if loader_cpu is not None and loader_cpu < WORKER_IDLE_PCT:
        who = "workers" if ev.workers > 0 else "training process"
        lines.append(f"{who} idle: {loader_cpu:.0f} % of a core on average while the loop waited")
    return lines


def _loader_cpu_pct(ev: InputEvidence) -> float | None:
    if ev.workers > 0:
        return sum(ev.worker_cpu_pct) / len(ev.worker_cpu_pct) if ev.worker_cpu_pct else None
    return ev.main_cpu_pct


def decide_input_cause(ev: InputEvidence) -> InputCause:
    """Why an input-bound phase waits: ``storage``, ``cpu`` or ``workers`` (see module doc).

    Examples:
        >>> decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[98.0, 97.0])).cause
        'cpu'
    """
    saturated = _cpu_saturated(ev)
    if saturated:
        # Cold reads beside a saturated CPU: the files came from disk, but the loaders were busy
        # computing, not waiting for it (the seed's epoch 1: disk 20-25 %, CPU the limit).
        cold = cold_reads(ev)
        if cold:
            saturated.append("cold cache, not the limit: " + ", ".join(cold))
        return InputCause("cpu", saturated)
    cold, stalled = cold_reads(ev), _stalled(ev)
    if cold and stalled:
        return InputCause("storage", cold + stalled)
    if (at_cores := _workers_at_cores(ev)) is not None:
        return InputCause("cpu", [at_cores] + (["cold cache, not the limit: " + ", ".join(cold)]
                                               if cold else []))
    if ev.workers > 0:
        # "not saturated" rests on the workers' CPU samples; without them say only the count
        # (a tf.data pipeline's threads are not sampled apart from the training process's).
        unsampled = ", its CPU not sampled" if ev.workers == 1 else ", their CPU not sampled"
        lines = [fmt_count(ev.workers, ev.worker_word)
                 + (", not saturated" if ev.worker_cpu_pct else unsampled)]
        if ev.worker_cpu_pct:
            lines.append("workers at " + ", ".join(f"{p:.0f} %" for p in ev.worker_cpu_pct)
                         + " of a core")
        # Busy cores with the loaders asleep on the disk reach here too (not the CPU's limit):
        # the figure is evidence then, but "to spare" would be false.
        spare = _spare_core(ev)
        if spare:
            lines.append(spare)
        elif ev.job_cpu_pct is not None:
            lines.append(f"the job used {ev.job_cpu_pct:.0f} % of its cores{_stolen(ev)}")
        elif ev.host_cpu_pct is not None:
            lines.append(f"host CPU {ev.host_cpu_pct:.0f} %")
        if not cold and ev.rchar_bytes:
            lines.append("reads served from the page cache")
        return InputCause("workers", lines + stalled)
    lines = ["workers=0: batches are prepared inline, between steps"]
    if ev.main_cpu_pct is not None:
        lines.append(f"training process at {ev.main_cpu_pct:.0f} % of a core")
    spare = _spare_core(ev)
    return InputCause("workers" if spare else "cpu", lines + ([spare] if spare else []) + cold)
