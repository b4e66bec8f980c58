"""The public API for instrumenting a training loop: :class:`Monitor`.

``stepscope train`` uses exactly this API; so can any PyTorch loop.

Examples:
    >>> import stepscope
    >>> with stepscope.Monitor("runs/mine", dataset_files=files) as mon:
    ...     for epoch in range(epochs):
    ...         for x, y in mon.loader(train_loader, phase="train", epoch=epoch):
    ...             with mon.copy():
    ...                 x, y = x.to(device), y.to(device)
    ...             with mon.compute():
    ...                 loss = loss_fn(model(x), y)
    ...                 loss.backward()
    ...                 opt.step()
    ...                 opt.zero_grad()
    ...         for x, y in mon.loader(val_loader, phase="val", epoch=epoch):
    ...             ...
"""

from __future__ import annotations

import contextlib
import operator
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from stepscope.observe import stages
from stepscope.observe.inject.stepscope_watch_stages import NOT_READY_S
from stepscope.observe.sampling import phase_io_totals, phase_resident_frac
from stepscope.observe.steps import GpuEvent, StepTimer
from stepscope.store.db import RunWriter
from stepscope.store.records import PhaseRecord, RunInfo, Sample, StepRecord
from stepscope.store.rundir import DB_NAME, RunDir

T = TypeVar("T")

# Steps travel as rows (tuples in StepRecord field order): building a dataclass per step cost
# about a microsecond on every instrumented loop.
_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
_STEP_ROW = operator.attrgetter(*_STEP_FIELDS)
_WALL, _WAIT, _IMAGES = (_STEP_FIELDS.index(n) for n in ("wall_s", "data_wait_s", "images"))

# The first steps of the run's first train and first val phase pay one-off costs (kernel and
# oneDNN primitive creation, allocator growth, cuDNN autotuning); they are kept but marked so
# steady-state figures leave them out. Worker start-up in later epochs is a real per-epoch
# cost and stays in.
DEFAULT_WARMUP_STEPS = 3


@dataclass
class LiveStats:
    """What a progress line shows, over the last steps and the latest samples."""

    images_per_s: float | None = None
    data_wait_frac: float | None = None
    cpu_util_pct: float | None = None
    gpu_util_pct: float | None = None
    disk_read_bytes_per_s: float | None = None


class _LatestTee:
    """Passes samples to the writer and keeps the newest value of each series for live views."""

    def __init__(self, writer: RunWriter) -> None:
        self._writer = writer
        self.latest: dict[tuple[str, str], float] = {}

    def add_samples(self, samples: Iterable[Sample]) -> None:
        batch = list(samples)
        for s in batch:
            self.latest[(s.source, s.metric)] = s.value
        self._writer.add_samples(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def _count_images(batch: Any) -> int:
    """Images in a batch: the length of its first tensor-like element."""
    # Exact types first: isinstance against a tuple of types cost ~0.2 µs a check here, and
    # this runs once a step. Subclasses (a namedtuple batch, a bool) go on through the
    # isinstance checks below, which then see the same element the descent reached.
    first = batch
    kind = type(first)
    while (kind is tuple or kind is list) and first:
        first = first[0]
        kind = type(first)
    if kind is int or kind is float:
        return 1
    plain = _PLAIN_TYPES.get(kind)
    if plain is None:  # once per type: is it none of the kinds handled below?
        plain = _PLAIN_TYPES[kind] = not issubclass(kind, (list, tuple, dict, int, float))
    if plain:  # a tensor or array: straight to its shape
        return _length(first)
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    if isinstance(first, (int, float)):  # a batch of plain numbers: one item (no len())
        return 1
    return _length(first)


# Types of batch elements that are no list, tuple, dict or number (tensors, arrays), as met.
_PLAIN_TYPES: dict[type, bool] = {}


def _length(first: Any) -> int:
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(first)
    except TypeError:
        return 1


class Monitor(AbstractContextManager["Monitor"]):
    """Records a training run into ``run_dir/run.db``: steps, phases, system samples, facts.

    Args:
        run_dir: where the run database goes (created).
        dataset_files: the dataset's files, for page-cache residency (sampled when many).
        interval_s: sampling period of the background samplers (1 Hz default, up to 10 Hz).
        device: ``"cuda"``/``torch.device`` to time copy and compute with CUDA events.
        sample: run the background samplers (off: steps and phases only).
        warmup_steps: steps at the start of the first train/val phase marked as warm-up.
        root_pid: whose process tree to sample (default: this process).
        host_samplers: also sample host-wide series (CPU, memory, disks, page cache, GPUs);
            off, only this process tree is sampled.
        stage_timing: time the loader's stages (read, decode, transform, collate, pin) in this
            process and its DataLoader workers (``stepscope.observe.stages``).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        name: str | None = None,
        command: str | None = None,
        kind: str = "monitor",
        dataset_files: Sequence[Path] = (),
        interval_s: float = 1.0,
        device: Any = None,
        sample: bool = True,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        # free-form: the run's configuration as the caller gives it (stored in the run row)
        config: dict[str, Any] | None = None,
        rank: int = 0,
        world_size: int = 1,
        db_name: str = DB_NAME,
        root_pid: int | None = None,
        host_samplers: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        stage_timing: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self._stage_timing = stage_timing
        self._stages_dir: Path | None = None
        self._clock = clock
        self._warmup_steps = warmup_steps
        self._warm_phases: set[str] = set()
        self._dataset_files = [Path(f) for f in dataset_files]
        self._interval_s = min(max(interval_s, 0.1), 60.0)
        self._sample = sample
        self._root_pid = root_pid or os.getpid()
        self._host_samplers = host_samplers
        self._info = RunInfo(
            name=name or self.run_dir.name,
            command=command or " ".join(sys.argv),
            device=str(device or "cpu"),
            kind=kind,
            rank=rank,
            world_size=world_size,
            config=config or {},
        )
        self._db_name = db_name
        self._phase_id = 0
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=50)  # rows in StepRecord order
        self._lock = threading.Lock()
        self.writer: RunWriter | None = None
        self._tee: _LatestTee | None = None
        self._sampler: Any = None
        self._tree: Any = None
        self._residency: Any = None
        self.timer = StepTimer(
            emit=self._emit_step, clock=clock, event_factory=_cuda_event_factory(device)
        )
        self._copy_part = self.timer.part("transfer")
        self._compute_part = self.timer.part("compute")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Monitor:
        """Open the run database and start the samplers (``with Monitor(...)`` does this)."""
        if self.writer is not None:
            return self
        self.writer = RunWriter(self.run_dir, self._info, db_name=self._db_name)
        self._phase_id = self.writer.next_phase_id
        # The writer's own queue takes the rows: no Python frame per step (live() reads them
        # back from the writer).
        self.timer.emit_row = self.writer.add_step_row
        self._tee = _LatestTee(self.writer)
        self.writer.fact("env.cpu_count", len(os.sched_getaffinity(0)), "os.sched_getaffinity")
        self._start_stage_timing()
        self._start_samplers()
        return self

    def _start_stage_timing(self) -> None:
        """Give this process and its future DataLoader workers a folder for stage counters.

        The folder goes in the environment so that workers started with ``spawn`` find it too;
        hooks are installed for the libraries already imported (forked workers inherit them).
        """
        if not self._stage_timing:
            return
        # Per recording process: ranks sharing a run directory keep their counters apart.
        folder = RunDir(self.run_dir).stages / str(os.getpid())
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.note("stages", f"loader stage timing off: {exc}")
            return
        self._stages_dir = folder
        stages.set_folder(str(folder))
        hooked = stages.install_loaded(dict(sys.modules))
        self.fact("stages.hooks", hooked, "libraries whose loader functions are timed")

    def _start_samplers(self) -> None:
        assert self.writer is not None and self._tee is not None
        from stepscope.observe import sampling

        samplers = sampling.create_samplers(
            root_pid=self._root_pid,
            dataset_files=self._dataset_files,
            note=self.writer.note,
        ) if self._sample else []
        for s in samplers:
            for key, (value, how) in getattr(s, "identities", dict)().items():
                self.writer.fact(key, value, how)
        if not self._host_samplers:
            # Another process on this host (e.g. local rank 0 under torchrun) samples the
            # machine; this one keeps only its own process tree, which also gives the phases
            # their I/O counters.
            samplers = [s for s in samplers if s.name == "tree"]
            self.writer.note("host", "host-wide series are sampled by local rank 0 (another "
                             "process of this job on this host), not here")
        for s in samplers:
            if s.name == "tree":
                self._tree = s
            if s.name == "pagecache":
                self._residency = s
                self.writer.fact(
                    "dataset.residency_sample_files", _count(getattr(s, "sample_files", None)),
                    "files whose page-cache residency is measured (all, or a random sample)",
                )
        if self._dataset_files and self._residency is None and self._sample:
            self.writer.note("pagecache", "dataset residency not measured (sampler unavailable)")
        if samplers:
            self._sampler = sampling.SamplerThread(
                samplers, self._tee, interval_s=self._interval_s
            )
            self._sampler.start()

    def close(self, status: str = "completed", exit_code: int | None = None) -> None:
        """Stop sampling, flush every record, mark the run ``status``."""
        if self.writer is None:
            return
        self.timer.resolve(block=True)
        # Read our threads' CPU time while they still exist; the last sample costs little.
        monitor_cpu_s = _own_threads_cpu_s()
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                self._sampler.stop()
        self.writer.fact(
            "monitor.cpu_s", monitor_cpu_s, "CPU time of stepscope's sampler and writer threads"
        )
        self.writer.close(status, exit_code)
        self._stop_stage_timing()

    def _stop_stage_timing(self) -> None:
        if self._stages_dir is None:
            return
        if os.environ.get(stages.ENV_DIR) == str(self._stages_dir):
            stages.set_folder(None)
        # The counters were read at every phase end; the files are scratch.
        shutil.rmtree(self._stages_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # other ranks may still be recording there
            self._stages_dir.parent.rmdir()
        self._stages_dir = None

    def __enter__(self) -> Monitor:
        return self.start()

    @property
    def store_error(self) -> str | None:
        """Why recording stopped mid-run (a write to run.db failed, e.g. a full disk), if it did."""
        return self.writer.error if self.writer is not None else None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            status = "completed"
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            status = "interrupted"
        else:
            status = "failed"
        self.close(status)

    # -- phases and steps --------------------------------------------------------------------
    def loader(
        self, iterable: Iterable[T], *, phase: str, epoch: int, workers: int | None = None
    ) -> Iterator[T]:
        """Iterate ``iterable`` as one phase of one epoch, timing each step's data wait.

        Creating the iterator (which starts DataLoader workers) counts as the first step's wait.
        """
        if phase not in ("train", "val"):
            raise ValueError(f"phase must be 'train' or 'val', got {phase!r}")
        if workers is None:
            workers = getattr(iterable, "num_workers", None)
        rec = self._begin_phase(phase, epoch, workers)
        warm = 0 if phase in self._warm_phases else self._warmup_steps
        self._warm_phases.add(phase)
        probe = stages.LoaderProbe(self._stages_dir, os.getpid())
        probe.begin()
        # The loading thread's CPU during a wait is the loading itself when it runs inline
        # (workers=0); see _WaitCpu for why only some waits read that clock.
        inline = not workers
        waits = _WaitCpu()
        step = images_total = not_ready = 0
        wait_s = 0.0
        timer = self.timer
        clock, thread_time = self._clock, time.thread_time
        phase_id = rec.phase_id
        # CPU steps are opened and closed here, their identity and wait kept in this frame
        # (StepTimer.close_cpu); GPU-timed steps take the timer's open/end.
        fast = timer.cpu_step()
        cpu, emit = fast if fast is not None else (None, _discard)
        offset = timer.clock_offset
        t_start = 0.0
        try:
            t0 = clock()
            c0 = thread_time() if inline else -1.0
            for batch in iterable:
                t1 = clock()
                wait = t1 - t0
                wait_s += wait
                if wait > NOT_READY_S:
                    not_ready += 1
                if c0 >= 0.0:
                    waits.clocked(wait, thread_time() - c0)
                elif inline and wait >= CLOCK_MIN_S:
                    waits.long_s += wait
                if step == 0:  # the probe reads the loaders' counters after the first batch
                    probe.waited(wait, 0.0)
                images = _count_images(batch)
                warmup = step < warm
                t_start = t0
                if cpu is not None:
                    cpu.transfer_s = cpu.compute_s = cpu.comm_s = 0.0
                    cpu.loss = None
                    timer.current = cpu
                else:
                    timer.open(phase_id, step, t0, wait, images, warmup)
                images_total += images
                step += 1
                yield batch
                t0 = clock()
                c0 = thread_time() if inline and (
                    wait >= CLOCK_MIN_S or step % CLOCK_EVERY == 0) else -1.0
                if cpu is None:
                    timer.end(t0)
                    continue
                # StepTimer.close_cpu, inlined: one Python call less a step.
                timer.current = None
                wall = t0 - t_start
                if wall < 0.0:
                    wall = 0.0
                other = wall - wait - cpu.transfer_s - cpu.compute_s - cpu.comm_s
                emit((phase_id, step - 1, t_start + offset, wall, wait, cpu.transfer_s,
                      cpu.compute_s, other if other > 0.0 else 0.0, images, warmup,
                      cpu.comm_s, cpu.loss))
        finally:
            if timer.current is not None:  # the loop broke out mid-step
                if cpu is not None and timer.current is cpu:
                    timer.close_cpu(cpu, clock(), phase_id, step - 1, t_start, wait, images,
                                    warmup)
                else:
                    timer.end(clock())
            rec.steps = step
            rec.images = images_total
            self._end_phase(rec)
            probe.set_waits(step, wait_s, waits.cpu_s(wait_s) if inline else 0.0,
                            not_ready, waits.clocked_s if inline else None)
            persistent = getattr(iterable, "persistent_workers", None)
            self.fact(f"stages.phase.{rec.phase_id}",
                      probe.end(workers, None if persistent is None else bool(persistent)),
                      "loader stage counters (observe/stages.py) over the phase")

    def copy(self) -> contextlib.AbstractContextManager[None]:
        """Time the host-to-device copy of the current step."""
        part = self._copy_part  # kept here: one call less per step than asking the timer
        return part if not part.active else self.timer.part("transfer")

    def compute(self) -> contextlib.AbstractContextManager[None]:
        """Time forward + backward + optimizer of the current step."""
        part = self._compute_part
        return part if not part.active else self.timer.part("compute")

    def comm(self) -> contextlib.AbstractContextManager[None]:
        """Time distributed communication (all-reduce) when it is not inside ``compute``."""
        return self.timer.part("comm")

    def set_loss(self, loss: float) -> None:
        """Attach the step's loss (a Python float: reading a GPU tensor here would sync)."""
        if self.timer.current is not None:
            self.timer.current.loss = loss

    def _begin_phase(self, phase: str, epoch: int, workers: int | None) -> PhaseRecord:
        with self._lock:
            phase_id = self._phase_id
            self._phase_id += 1
        rb, rc = phase_io_totals(self._tree)
        resident = phase_resident_frac(self._residency)
        rec = PhaseRecord(
            phase_id=phase_id, epoch=epoch, phase=phase, started=time.time(),
            resident_frac_start=resident, read_bytes_start=rb, rchar_start=rc,
            workers=workers, rank=self._info.rank,
        )
        if self.writer is not None:
            self.writer.put_phase(rec)
        return rec

    def _end_phase(self, rec: PhaseRecord) -> None:
        # The last steps' GPU events must be read before the phase's figures are final; this
        # is the one place where timing waits for the GPU.
        self.timer.resolve(block=True)
        rec.ended = time.time()
        rec.read_bytes_end, rec.rchar_end = phase_io_totals(self._tree)
        rec.resident_frac_end = phase_resident_frac(self._residency)
        if self.writer is not None:
            self.writer.put_phase(rec)

    def _emit_step(self, rec: StepRecord) -> None:
        row = _STEP_ROW(rec)
        self._recent.append(row)
        if self.writer is not None:
            self.writer.add_step_row(row)


    def fact(self, key: str, value: Any, how_measured: str = "") -> None:
        if self.writer is not None:
            self.writer.fact(key, value, how_measured)

    def note(self, source: str, text: str) -> None:
        if self.writer is not None:
            self.writer.note(source, text)

    def record(self, source: str, metric: str, value: float) -> None:
        """Record one value of a custom series now (e.g. ``trainer/checkpoint_write_s``)."""
        if self.writer is not None:
            self.writer.add_samples([Sample(time.time(), source, metric, float(value))])

    def update_run(self, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.update_run(**fields)

    def live(self) -> LiveStats:
        """Figures for a progress line: the last 50 steps and the newest samples."""
        stats = LiveStats()
        recent = self.writer.latest_step_rows() if self.writer is not None else list(self._recent)
        wall = sum(r[_WALL] for r in recent)
        if wall > 0:
            stats.images_per_s = sum(r[_IMAGES] for r in recent) / wall
            stats.data_wait_frac = sum(r[_WAIT] for r in recent) / wall
        latest = self._tee.latest if self._tee is not None else {}
        stats.cpu_util_pct = latest.get(("host", "cpu_util_pct"))
        stats.gpu_util_pct = latest.get(("gpu0", "util_pct"))
        stats.disk_read_bytes_per_s = latest.get(("tree", "read_rate_bytes_per_s"))
        return stats


# The loading thread's CPU clock is read around a wait that follows one of at least this long
# (a loop whose batches come in microseconds would pay more for the reading than for its
# loading), and around every CLOCK_EVERY-th wait whatever its length.
CLOCK_MIN_S = 50e-6
CLOCK_EVERY = 64


class _WaitCpu:
    """The loading thread's CPU during the phase's data waits, when loading runs inline.

    Reading a thread's CPU clock is a system call (~1 µs: CPU-time clocks have no vDSO fast
    path), twice a step; a loop whose batches come in microseconds would pay more for the
    reading than for its loading. So the clock is read around a wait that follows one of at
    least CLOCK_MIN_S, and around every CLOCK_EVERY-th wait. An unclocked wait under
    CLOCK_MIN_S counts as CPU (a loader that answers that fast has not slept on storage); a
    longer one gets the CPU share of the clocked waits. ``clocked_s`` (in the phase's stage
    fact) says how much of the wait was read rather than estimated.
    """

    __slots__ = ("clocked_s", "cpu_read_s", "long_s")

    def __init__(self) -> None:
        self.clocked_s = self.cpu_read_s = self.long_s = 0.0

    def clocked(self, wall_s: float, cpu_s: float) -> None:
        self.clocked_s += wall_s
        self.cpu_read_s += cpu_s

    def cpu_s(self, wait_s: float) -> float:
        # The CPU clock is read just after the wall clock at both ends, so a wait that was all
        # CPU reads a little more CPU than wall; no wait can hold more CPU than its length.
        read_s = min(self.cpu_read_s, self.clocked_s)
        share = read_s / self.clocked_s if self.clocked_s > 0 else 1.0
        short_s = max(wait_s - self.clocked_s - self.long_s, 0.0)
        return read_s + short_s + self.long_s * share


def _discard(row: tuple[Any, ...]) -> None:
    """The row sink of a loader whose steps take the timer's own path (never called)."""


def _count(value: Any) -> int | None:
    if value is None:
        return None
    return value if isinstance(value, int) else len(value)


def _cuda_event_factory(device: Any) -> Callable[[], GpuEvent] | None:
    if device is None or "cuda" not in str(device):
        return None
    import torch

    return lambda: torch.cuda.Event(enable_timing=True)


def _own_threads_cpu_s() -> float:
    """CPU seconds used by stepscope's own background threads in this process."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for th in threading.enumerate():
        if not th.name.startswith("stepscope") or th.native_id is None:
            continue
        try:
            fields = Path(f"/proc/self/task/{th.native_id}/stat").read_text().rsplit(")", 1)[1]
            parts = fields.split()
            total += (int(parts[11]) + int(parts[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total
