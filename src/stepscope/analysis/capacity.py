"""Capacities of an input pipeline, the stage that binds, and what a fix would gain.

Every figure is images per second, from one phase's measurements (docs/input-causes.md):

- ``consume``  what the model would take with data always ready: images over the steady
  steps' time outside the data wait (copy + compute + the rest of the loop).
- ``loader``   what the loaders supply: ``per_worker × workers`` where a loader's rate is items
  over its time inside fetches (``observe/stages.py``).
- ``cpu``      what the job's cores can run at all: ``job_cores / (model CPU + loading CPU per
  image)``. The cores are those this job may use (affinity and cgroup quota, never the
  host's); the model's CPU per image is the training process's CPU outside its data waits,
  the loading CPU per image is the loaders' own (read from the loading threads).
- ``storage``  with a cold cache, items over the time the loaders were blocked (off-CPU and not
  runnable: disk), per loader; None when the page cache served the reads.

A fix's predicted speed-up is today's time per image over ``max(1/consume, 1/loader', 1/cpu)``
where ``loader'`` is the capacity after the change (more workers, work moved off the main
process, a worker pool kept across phases). It is a model, so the tool also says how sure it
is, and ``compare``/``tune`` put it beside what the rerun achieved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from stepscope.analysis.contracts_summary import CapacityRow, PredictionRow
from stepscope.policy import unstolen

# Headroom asked of the loaders over what the model consumes: steps vary, and a queue that is
# only just fed still stalls on every slow batch.
HEADROOM = 1.15
MIN_GAIN = 1.10  # below this a change is within the noise of a shared machine
MIN_STEADY_BATCHES = 3
MAX_WORKERS_PER_CORE = 2
# Loaders runnable but waiting for a core this share of their fetch time were denied CPU.
CONTENDED_FRAC = 0.3
LATENCY_BOUND_FRAC = 0.3  # loaders blocked (sleeping, not runnable) this share: latency-bound
# A job never runs its cores' whole CPU limit: the loaders' hand-over, the training loop's own
# bookkeeping and the host's other work take a share. Saturated runs of the planted
# cores-saturated scenario reached 90-99 % of it (64-70 img/s against 71); a prediction capped
# by the cores is made against this much of the limit, so a job already at ~90 % of it is not
# promised 1.1x from one more worker.
CPU_REACHABLE = 0.95


@dataclass(frozen=True)
class LoaderFigures:
    """One phase's loader counters (the ``stages.phase.<id>`` fact), in plain numbers."""

    workers: int
    persistent: bool | None
    items: float
    fetch_s: float
    fetch_cpu_s: float
    fetch_runq_s: float
    read_bytes: float
    stage_s: dict[str, float]
    worker_busy_s: list[float]
    main_collate_s: float
    main_pin_s: float
    waits: int
    wait_s: float
    wait_cpu_s: float
    not_ready: int
    first_wait_s: float | None

    @property
    def blocked_s(self) -> float:
        """Loader time off-CPU and not waiting for a CPU: disk, network, sleeps."""
        return max(0.0, self.fetch_s - self.fetch_cpu_s - self.fetch_runq_s)

    startup_from_steps_s: float | None = None
    # Per worker, beside worker_busy_s: its on-CPU and run-queue seconds inside batches.
    worker_cpu_s: list[float] = field(default_factory=list)
    worker_runq_s: list[float] = field(default_factory=list)
    # The workers are threads of the training process (Keras PyDataset without
    # use_multiprocessing), not processes: their CPU is inside the training process's.
    worker_threads: bool = False

    @property
    def startup_s(self) -> float:
        """Waits of the phase's first batches beyond a typical one: worker start-up."""
        if self.startup_from_steps_s is not None:
            return self.startup_from_steps_s
        if self.first_wait_s is None or self.waits < 2:
            return 0.0
        typical = (self.wait_s - self.first_wait_s) / (self.waits - 1)
        return max(0.0, self.first_wait_s - typical)


def loader_figures(fact: Any) -> LoaderFigures | None:
    """Parse a ``stages.phase.<id>`` fact; None when the stages were not measured."""
    if not isinstance(fact, dict) or not fact.get("stages_measured"):
        return None
    main = fact.get("main") or {}
    # Rates come from the batches after the first (its one-off costs are the start-up figure),
    # when there were enough of them to measure.
    steady = fact.get("steady") or {}
    if (steady.get("batches") or 0) >= MIN_STEADY_BATCHES and steady.get("fetch_s"):
        fact = {**fact, **steady}
    return LoaderFigures(
        workers=int(fact.get("loader_workers") or 0),
        persistent=fact.get("persistent_workers"),
        items=float(fact.get("items") or 0.0), fetch_s=float(fact.get("fetch_s") or 0.0),
        fetch_cpu_s=float(fact.get("fetch_cpu_s") or 0.0),
        fetch_runq_s=float(fact.get("fetch_runq_s") or 0.0),
        read_bytes=float(fact.get("read_bytes") or 0.0),
        stage_s={k: float(v) for k, v in (fact.get("stage_s") or {}).items()},
        worker_busy_s=[float(w.get("busy_s") or 0.0) for w in fact.get("workers") or []],
        main_collate_s=float(main.get("collate_s") or 0.0),
        main_pin_s=float(main.get("pin_s") or 0.0) if main else
        float((fact.get("stage_s") or {}).get("pin") or 0.0),
        waits=int(fact.get("waits") or 0), wait_s=float(fact.get("wait_s") or 0.0),
        wait_cpu_s=float(fact.get("wait_cpu_s") or 0.0),
        not_ready=int(fact.get("not_ready_steps") or 0),
        first_wait_s=fact.get("first_wait_s"),
        startup_from_steps_s=fact.get("startup_from_steps_s"),
        worker_cpu_s=[float(w.get("cpu_s") or 0.0) for w in fact.get("workers") or []],
        worker_runq_s=[float(w.get("runq_s") or 0.0) for w in fact.get("workers") or []],
        worker_threads=bool(fact.get("worker_threads")),
    )


class PhaseFigures(TypedDict, total=False):
    """What the capacity model reads of a phase. Each caller passes the figures its question
    needs (the capacities: the split and the CPU; a prediction: seconds, images, repeat)."""

    step_ms_per_image: float | None
    data_wait_ms_per_image: float | None
    main_cpu_pct: float | None  # the training process, % of one core
    tree_cpu_pct: float | None  # the whole process tree, % of one core
    host_cpu_pct: float | None  # the host, % of all its cores
    host_cores: int | None
    steal_pct: float | None  # the hypervisor's share of the host's CPU time (a VM's steal)
    seconds: float
    images: int
    repeat: bool  # a phase of the same kind ran before (its workers could have been kept)


@dataclass
class Capacity:
    """Capacities (images/s) of one phase and the cores behind them."""

    now_images_per_s: float
    consume_images_per_s: float | None
    per_loader_images_per_s: float | None
    loader_images_per_s: float | None
    storage_images_per_s: float | None
    cpu_s_per_image: float | None
    runq_s_per_image: float
    job_cores: float | None
    obtainable_cores: float | None
    compute_cores: float | None
    spare_cores: float | None
    model_cpu_s_per_image: float | None
    cpu_images_per_s: float | None
    binding: str | None
    stage_ms_per_image: dict[str, float] = field(default_factory=dict)
    steal_frac: float = 0.0  # of the host's CPU time, run by the hypervisor for other guests

    def to_dict(self) -> CapacityRow:
        # The row's keys are this dataclass's fields, one for one (contracts_summary.CapacityRow).
        return cast("CapacityRow", dict(vars(self)))


def obtainable_cores(cores: float | None, phase: PhaseFigures) -> float | None:
    """The cores this job could have had: its allowed cores, but on a shared host no more than
    it used plus what the host left idle (other jobs' load is not ours to schedule)."""
    tree, host, n = phase.get("tree_cpu_pct"), phase.get("host_cpu_pct"), phase.get("host_cores")
    if cores is None or tree is None or host is None or not n:
        return cores
    idle = max(0.0, n * (1.0 - host / 100.0))
    return max(0.05, min(cores, tree / 100.0 + idle))


def _model_cpu(phase: PhaseFigures, lf: LoaderFigures) -> tuple[float | None, float | None]:
    """(cores the training process keeps busy outside its data waits, its CPU s per image)."""
    main_pct, seconds = phase.get("main_cpu_pct"), phase.get("seconds") or 0.0
    images = phase.get("images") or 0
    busy_s = seconds - lf.wait_s
    if main_pct is None or busy_s <= 0 or not images:
        return None, None
    # Loading threads run inside the training process: their CPU is in its figure, not the model's.
    threads_cpu_s = lf.fetch_cpu_s if lf.worker_threads else 0.0
    main_cpu_s = max(0.0, main_pct / 100.0 * seconds - lf.wait_cpu_s - threads_cpu_s)
    return main_cpu_s / busy_s, main_cpu_s / images


def build_capacity(phase: PhaseFigures, lf: LoaderFigures, cores: float | None,
                   cold: bool) -> Capacity | None:
    """The phase's capacities; None without steady steps to measure the model's rate."""
    step_ms, wait_ms = phase.get("step_ms_per_image"), phase.get("data_wait_ms_per_image")
    if not step_ms or wait_ms is None or lf.items <= 0 or lf.fetch_s <= 0:
        return None
    rest_ms = max(step_ms - wait_ms, 1e-6)
    per_loader = lf.items / lf.fetch_s
    cpu_per_image = lf.fetch_cpu_s / lf.items
    compute, model_cpu = _model_cpu(phase, lf)
    # Only loaders that were kept waiting for a core were denied one: a job that sleeps on
    # latency uses little CPU however idle the host is, and that says nothing about its cores.
    # And only loaders that want a CPU most of the time: ones that mostly sleep on latency
    # overlap their sleeps (and their waits for a core) when there are more of them.
    contended = lf.fetch_runq_s >= CONTENDED_FRAC * lf.fetch_s \
        and lf.blocked_s < LATENCY_BOUND_FRAC * lf.fetch_s
    left = unstolen(phase.get("steal_pct"))
    got = obtainable_cores(cores, phase) if contended else cores
    if not contended and got is not None:
        # On a VM the hypervisor's steal is the part of each core no process here could have:
        # the job's loaders were not seen waiting (steal is neither run-queue time nor their
        # CPU), yet a suite run whose host lost ~30 % so ran 2 saturated loaders at 70 % of the
        # 2 cores' ceiling and was told "more workers".
        got *= left
    spare = None if got is None else max(0.0, got - (compute if compute is not None else 1.0))
    cpu_rate = None
    if got is not None and model_cpu is not None and model_cpu + cpu_per_image > 0:
        cpu_rate = got / (model_cpu + cpu_per_image)
    loaders = max(lf.workers, 1)
    storage = None
    if cold and lf.blocked_s > 0:
        storage = lf.items / lf.blocked_s * loaders
    cap = Capacity(
        now_images_per_s=1000.0 / step_ms, consume_images_per_s=1000.0 / rest_ms,
        per_loader_images_per_s=per_loader, loader_images_per_s=per_loader * loaders,
        storage_images_per_s=storage, cpu_s_per_image=cpu_per_image,
        runq_s_per_image=lf.fetch_runq_s / lf.items, job_cores=cores, obtainable_cores=got,
        compute_cores=compute, spare_cores=spare, model_cpu_s_per_image=model_cpu,
        cpu_images_per_s=cpu_rate, binding=None,
        stage_ms_per_image={k: v / lf.items * 1000.0 for k, v in lf.stage_s.items()},
        steal_frac=1.0 - left,
    )
    cap.binding = _binding(cap, lf)
    return cap


def _binding(cap: Capacity, lf: LoaderFigures) -> str:
    """The stage with the least capacity (inline loading is serial with the model)."""
    rates: dict[str, float] = {}
    for name, rate in (("compute", cap.consume_images_per_s), ("loader", cap.loader_images_per_s),
                       ("storage", cap.storage_images_per_s), ("cpu", cap.cpu_images_per_s)):
        if rate is not None:
            rates[name] = rate
    if lf.workers == 0:
        # Loading inline adds to every step instead of overlapping it: the loader binds when
        # it takes longer per image than the model, and the job's cores are not yet the limit.
        rates.pop("cpu", None)
    return min(rates, key=rates.__getitem__)


# --------------------------------------------------------------------------- predictions


@dataclass(frozen=True)
class Prediction:
    """A change, the throughput it should reach and the speed-up over today's."""

    change: str
    images_per_s: float
    speedup: float
    basis: str


def _loader_rate_with(cap: Capacity, lf: LoaderFigures, workers: int) -> float | None:
    """Loader capacity with ``workers`` processes, bounded by what the job's cores can run."""
    if cap.per_loader_images_per_s is None:
        return None
    rate = cap.per_loader_images_per_s * workers
    if cap.cpu_images_per_s is not None:
        rate = min(rate, CPU_REACHABLE * cap.cpu_images_per_s)
    if cap.storage_images_per_s is not None:
        rate = min(rate, cap.storage_images_per_s / max(lf.workers, 1) * workers)
    return rate


def predict_workers(cap: Capacity, lf: LoaderFigures, workers: int) -> Prediction | None:
    """Throughput with ``workers`` DataLoader workers (loading overlaps the model's steps)."""
    rate = _loader_rate_with(cap, lf, workers)
    if rate is None or cap.consume_images_per_s is None:
        return None
    main_work = 0.0
    if lf.workers == 0 and lf.items:
        # Collate and pin stay in the training process's loop with workers; what moves out is
        # the per-item work.
        main_work = lf.main_pin_s / lf.items
    per_image = max(1.0 / cap.consume_images_per_s + main_work, 1.0 / rate)
    new = 1.0 / per_image
    basis = (f"loader {cap.per_loader_images_per_s:.0f} img/s per worker × {workers}"
             + (f", the job's {cap.job_cores:g} cores run at most {cap.cpu_images_per_s:.0f} "
                f"img/s ({CPU_REACHABLE:.0%} of it reachable)"
                if cap.cpu_images_per_s is not None and cap.job_cores else "")
             + f"; the model consumes {cap.consume_images_per_s:.0f} img/s")
    return Prediction(f"num_workers={workers}", new, new / cap.now_images_per_s, basis)


def workers_target(cap: Capacity, lf: LoaderFigures) -> int | None:
    """Fewest workers whose capacity covers what can be consumed (with headroom): the model's
    rate, or less when the job's cores cannot run that much; None when no count would gain."""
    if cap.per_loader_images_per_s is None or cap.consume_images_per_s is None:
        return None
    goal = cap.consume_images_per_s
    if cap.cpu_images_per_s is not None:
        goal = min(goal, CPU_REACHABLE * cap.cpu_images_per_s)
    target = max(1, math.ceil(HEADROOM * goal / cap.per_loader_images_per_s))
    if cap.job_cores:
        # Past a few processes per core each batch's hand-over to the training process (and
        # the processes' own scheduling) costs more than the overlap wins: PyTorch warns above
        # one per core; loaders that mostly sleep may take two.
        target = min(target, max(1, int(MAX_WORKERS_PER_CORE * cap.job_cores)))
    if target <= lf.workers:
        return None
    best = predict_workers(cap, lf, target)
    if best is None or best.speedup < MIN_GAIN:
        return None
    return target


def predict_persistent(phase: PhaseFigures, lf: LoaderFigures,
                       cap: Capacity | None = None) -> Prediction | None:
    """Keeping the worker pool across phases saves each phase's start-up beyond a normal wait,
    and the rest of the phase then runs at the warm pool's capacity.

    Freshly started workers are slow for longer than their first batch: each new process
    (fork) copies the parent's pages as either side writes them, or (spawn, forkserver)
    imports its modules again and warms its caches, while the training process hands it the
    work; a loaded host stretches all of it. So today's steady steps of a phase with new
    workers are no measure of a warm pool: the capacity model is (what the loaders supply per
    worker × workers against what the model consumes, from the same phase's fetches and
    steps), and a kept pool runs at that rate from its first step.
    """
    seconds = phase.get("seconds") or 0.0
    if lf.workers == 0 or lf.persistent or lf.startup_s <= 0 or seconds <= lf.startup_s:
        return None
    images = phase.get("images") or 0
    after = seconds - lf.startup_s
    new_s = after
    basis = f"start-up {lf.startup_s * 1000:.0f} ms of a {seconds:.2f} s phase"
    warm = None if cap is None else predict_workers(cap, lf, lf.workers)
    if warm is not None and warm.images_per_s > 0 and images:
        warm_s = images / warm.images_per_s
        if warm_s < after:
            new_s = warm_s
            basis += (f"; the rest at the warm pool's {warm.images_per_s:.0f} img/s ({warm.basis})"
                      f" instead of today's {images / after:.0f} img/s from new workers")
    return Prediction("persistent_workers=True", images / new_s if new_s else 0.0,
                      seconds / new_s, basis)


def predict_without_stage(cap: Capacity, lf: LoaderFigures, stage: str) -> Prediction | None:
    """Upper bound if one loader stage cost nothing (e.g. augmentation moved to the GPU)."""
    ms = cap.stage_ms_per_image.get(stage)
    if not ms or cap.per_loader_images_per_s is None or cap.consume_images_per_s is None:
        return None
    per_loader_ms = 1000.0 / cap.per_loader_images_per_s
    left = max(per_loader_ms - ms, 1e-3)
    scale = per_loader_ms / left
    rate = cap.per_loader_images_per_s * scale * max(lf.workers, 1)
    if cap.job_cores and cap.model_cpu_s_per_image is not None and lf.workers > 0:
        cpu_left = max((cap.cpu_s_per_image or 0.0) - ms / 1000.0, 0.0)
        rate = min(rate, cap.job_cores / max(cap.model_cpu_s_per_image + cpu_left, 1e-6))
    if lf.workers == 0:
        per_image = 1.0 / cap.consume_images_per_s + left / 1000.0
    else:
        per_image = max(1.0 / cap.consume_images_per_s, 1.0 / rate)
    new = 1.0 / per_image
    return Prediction(f"{stage} stage free", new, new / cap.now_images_per_s,
                      f"{stage} {ms:.1f} ms of {per_loader_ms:.1f} ms per image in a loader")


def predictions(lf: LoaderFigures, cap: Capacity, phase: PhaseFigures) -> list[PredictionRow]:
    """Every fix the capacities can price for this phase, as plain dicts (summary.json)."""
    found: list[Prediction | None] = []
    target = workers_target(cap, lf)
    if target is not None:
        found.append(predict_workers(cap, lf, target))
    if phase.get("repeat"):
        found.append(predict_persistent(phase, lf, cap))
    for stage in ("transform", "decode", "item", "collate"):
        found.append(predict_without_stage(cap, lf, stage))
    out: list[PredictionRow] = []
    for p in found:
        if p is None or p.speedup < 1.0:
            continue
        row: PredictionRow = {"change": p.change, "images_per_s": p.images_per_s,
                              "speedup": p.speedup, "basis": p.basis}
        if p.change.startswith("num_workers") and target is not None:
            row["workers"] = target
        out.append(row)
    return out


def workers_curve(cap: Capacity, lf: LoaderFigures, up_to: int = 16) -> dict[str, float]:
    """Predicted speed-up for each worker count 1..``up_to`` (``compare`` looks up
    the count it tried)."""
    out: dict[str, float] = {}
    for w in range(1, up_to + 1):
        p = predict_workers(cap, lf, w)
        if p is not None:
            out[str(w)] = p.speedup
    return out


# --------------------------------------------------------------------------- loading threads

# Loading threads of one process run Python one at a time (the GIL): however many there are,
# together they are on a CPU about one core at most, and a thread waiting for the GIL sleeps
# (neither on a CPU nor runnable). The thread pool is GIL-bound when its threads are inside
# batches most of the phase, on a CPU a small share of that time, together about one core at
# most, asleep a material share of it (the GIL wait: a busy host alone shows as run-queue
# time, not sleep), and wanting about a core (on a CPU or runnable: CPU work, not I/O waits).
# "A small share" is up to 0.8: a thread also waits for the GIL *outside* ``__getitem__``, to
# take its next batch and to hand this one over, and that wait is not in its busy time. On
# the torch backend, whose loop thread takes the GIL back ~30 times a step, two threads doing
# a fixed 80 ms of Python a batch were on a CPU 65 % of their busy time (JAX: 48 %).
GIL_BUSY_FRAC = 0.5
GIL_ON_CPU_MAX_FRAC = 0.8
GIL_MAX_CORES = 1.1
GIL_ASLEEP_MIN_FRAC = 0.15
GIL_WANT_MIN_CORES = 0.7


@dataclass(frozen=True)
class ThreadFigures:
    """A phase's loading threads: each one's busy and on-CPU share of the phase, and together."""

    busy_frac: list[float]
    cpu_frac: list[float]
    cores_used: float  # the threads' CPU seconds over the phase's: cores they used together
    cores_wanted: float  # on a CPU or in the run queue, together
    cpu_s_per_image: float

    @property
    def asleep_frac(self) -> float:
        """Share of the threads' busy time neither on a CPU nor runnable (the GIL wait, or I/O)."""
        busy = sum(self.busy_frac)
        return max(0.0, busy - self.cores_wanted) / busy if busy > 0 else 0.0

    @property
    def gil_bound(self) -> bool:
        busy = sum(self.busy_frac)
        return (len(self.busy_frac) >= 2 and busy >= GIL_BUSY_FRAC * len(self.busy_frac)
                and self.cores_used <= GIL_ON_CPU_MAX_FRAC * busy
                and self.cores_used <= GIL_MAX_CORES and self.asleep_frac >= GIL_ASLEEP_MIN_FRAC
                and self.cores_wanted >= GIL_WANT_MIN_CORES)


def thread_figures(lf: LoaderFigures, seconds: float | None,
                   steal_frac: float = 0.0) -> ThreadFigures | None:
    """The loading threads' figures; None when the workers are processes or were not timed.

    On a VM whose hypervisor ran other guests ``steal_frac`` of the time, a thread that held a
    core was stopped that share of it without the guest seeing it (neither its CPU clock nor
    its run-queue time grows), so what it wanted is its CPU time scaled back up. A rehearsal on
    a VM losing ~30 % so read two GIL-bound threads as 0.55 of a core and not GIL-bound."""
    if not lf.worker_threads or not lf.worker_busy_s or not seconds or seconds <= 0 \
            or lf.items <= 0 or len(lf.worker_cpu_s) != len(lf.worker_busy_s):
        return None
    cpu_s = sum(lf.worker_cpu_s)
    return ThreadFigures(
        busy_frac=[b / seconds for b in lf.worker_busy_s],
        cpu_frac=[c / seconds for c in lf.worker_cpu_s],
        cores_used=cpu_s / seconds,
        cores_wanted=(cpu_s / unstolen(100.0 * steal_frac) + sum(lf.worker_runq_s)) / seconds,
        cpu_s_per_image=cpu_s / lf.items)


def predict_processes(cap: Capacity, lf: LoaderFigures, seconds: float | None
                      ) -> Prediction | None:
    """GIL-bound loading threads turned into as many processes (``use_multiprocessing=True``):
    each then supplies one image per the threads' own CPU time per image, on a core of its
    own, bounded by what the job's cores can run and what the model consumes. None unless
    the threads are GIL-bound and the gain is ≥ ``MIN_GAIN``.

    The cores are the job's own (affinity, quota), not what a busy host left it during the
    phase: the GIL holds the threads to one core on any host, and other people's load comes
    and goes (the cause's evidence says when the host was contended)."""
    tf = thread_figures(lf, seconds, cap.steal_frac)
    if tf is None or not tf.gil_bound or tf.cpu_s_per_image <= 0 \
            or cap.consume_images_per_s is None:
        return None
    workers = max(lf.workers, len(lf.worker_busy_s))
    rate = workers / tf.cpu_s_per_image
    cpu_rate = None
    if cap.job_cores and cap.model_cpu_s_per_image is not None:
        cpu_rate = cap.job_cores / (cap.model_cpu_s_per_image + tf.cpu_s_per_image)
        rate = min(rate, CPU_REACHABLE * cpu_rate)
    new = 1.0 / max(1.0 / cap.consume_images_per_s, 1.0 / rate)
    # The threads' output over the whole phase bounds what the loop can have run at: steps that
    # found their batch made in the previous epoch's tail (a pool keeps filling its queue past
    # an epoch's last step) or that were left out as outliers make the steps alone read faster.
    # Keras on JAX, 24 steps an epoch: the steps read 129-216 img/s while the threads made 92.
    now = min(cap.now_images_per_s, lf.items / seconds) if seconds else cap.now_images_per_s
    speedup = new / now
    if speedup < MIN_GAIN:
        return None
    basis = (f"{workers} processes at {tf.cpu_s_per_image * 1000:.1f} ms of CPU per image (the "
             f"threads' own) supply {workers / tf.cpu_s_per_image:.0f} img/s"
             + (f", the job's {cap.job_cores:g} cores run at most {cpu_rate:.0f} img/s "
                f"({CPU_REACHABLE:.0%} of it reachable)" if cpu_rate is not None else "")
             + f"; the model consumes {cap.consume_images_per_s:.0f} img/s")
    got = cap.obtainable_cores
    if cpu_rate is not None and got is not None and cap.job_cores \
            and got < cap.job_cores - 0.25 and cap.model_cpu_s_per_image is not None:
        # What the same change gives while the host stays as busy as it was.
        busy_rate = min(workers / tf.cpu_s_per_image,
                        got / (cap.model_cpu_s_per_image + tf.cpu_s_per_image))
        busy_new = 1.0 / max(1.0 / cap.consume_images_per_s, 1.0 / busy_rate)
        basis += (f"; but in this phase the host's other processes left the job {got:.1f} "
                  f"cores, on which processes would run {busy_new:.0f} img/s "
                  f"({busy_new / cap.now_images_per_s:.2f}×)")
    return Prediction("use_multiprocessing=True", new, speedup, basis)
