"""The child side of ``stepscope watch``: turns loop events into step and phase records and sends
them to the watching parent over an inherited pipe, one JSON array per line.

This module runs inside the user's interpreter, which may not be stepscope's: it imports only the
standard library and never the stepscope package. The parent is the only writer of the run
database; the child only talks to the pipe.

Why the pipe is cheap: lines are buffered in a list and written with one ``os.write`` at most
every ``FLUSH_EVERY_S`` (or at phase boundaries, whose io/residency readings the parent wants
on time). A step costs one ``json.dumps`` of a dozen numbers, a few microseconds.

What each step number includes (the same frame as ``stepscope train``: a step runs from the
moment the loop asks the loader for a batch to the moment it asks for the next one):

- ``data_wait_s``: blocked in the loader's ``__next__`` (the first step of a phase also pays for
  creating the iterator, which starts the DataLoader workers). Lightning: from the end of the
  previous batch (or the phase start) to the start of its host→device copy
  (``transfer_batch_to_device``), or to the batch-begin callback. Keras: measured where each
  backend fetches its batch (``stepscope_watch_keras_steps``).
- ``transfer_s``: ``Tensor.to``/``Tensor.cuda`` calls that moved a tensor to a non-CPU device,
  on the main thread, CPU-side time (a ``non_blocking`` copy only costs its launch here).
  Lightning: the time in the LightningModule's ``transfer_batch_to_device`` hook, which the
  strategy runs before the batch-begin callback (:meth:`Recorder.cb_transfer`).
- ``compute_s``: training steps with an ``optimizer.step()``: from the batch's arrival to the end
  of the step's last ``optimizer.step()``, minus the transfers before it. Validation steps, and
  training steps without an optimizer step (gradient accumulation): everything after the batch's
  arrival minus transfers. Lightning: batch-begin to batch-end callback. Keras: the rest of the
  step, from one batch-begin callback to the next, minus the user's batch callbacks.
- ``other_s``: the rest (after the optimizer step: logging, metrics, ``loss.item()``...). Keras:
  the time the main thread spent in the user's own ``on_train_batch_begin``/``_end`` hooks.

On a GPU these are CPU-side times: work the GPU still has queued lands where the CPU waits for
it (a blocking copy, ``.item()``), not where it was launched.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject import stepscope_watch_stages as board_stages
else:
    try:  # in the watched interpreter a top-level module (see sitecustomize)
        import stepscope_watch_stages as board_stages
    except ImportError:
        from stepscope.observe.inject import stepscope_watch_stages as board_stages

WARMUP_STEPS = 3  # as stepscope.observe.monitor.DEFAULT_WARMUP_STEPS
FLUSH_EVERY_S = 0.5
FLUSH_LINES = 512
PERIODIC_EVERY_S = 1.0
MAX_DATASET_FILES = 500_000
MAX_PENDING_LINES = 20_000  # what a not-yet-claimed process keeps (its start: hello, imports)
# One encoder for every line: json.dumps with non-default options builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


class Channel:
    """Buffered JSON-lines writer to the parent; silently stops if the parent is gone.

    ``fd`` is the inherited pipe (the command's first Python process), or -1 for a process
    started further down the tree (a launcher's worker): that one holds its lines until it proves
    to be a training rank (:meth:`attach`, when it joins a process group) and, if it never does,
    drops them, so launchers' helpers and spawned DataLoader workers stay silent.
    """

    def __init__(self, fd: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self._fd = fd
        self._clock = clock
        self._lines: list[str] = []
        self._last_flush = clock()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._sock: Any = None
        self.broken = False
        board_stages.renew_lock_after_fork(self, "_lock")  # a forked loader process sends too

    @property
    def pending(self) -> bool:
        return self._fd < 0

    @property
    def socket(self) -> Any:
        """The socket to the parent (None on the pipe): it also carries the parent's answers."""
        return self._sock

    def attach(self, sock: Any, first: list[Any]) -> None:
        """Start talking over ``sock`` (a connected socket), ``first`` ahead of what waited."""
        with self._lock:
            self._sock = sock  # kept: the fd lives as long as the socket object
            self._fd = sock.fileno()
            self._lines.insert(0, _encode(first))
        self.flush()

    def send(self, msg: list[Any], *, urgent: bool = False) -> None:
        line = _encode(msg)
        with self._lock:
            if self.pending and len(self._lines) >= MAX_PENDING_LINES:
                return  # not a rank (yet): keep the start, drop the rest
            self._lines.append(line)
            due = (urgent or len(self._lines) >= FLUSH_LINES
                   or self._clock() - self._last_flush >= FLUSH_EVERY_S)
        if due:
            self.flush()

    def flush(self) -> None:
        # A forked process (a DataLoader worker) inherits the buffer and the fd; only the process
        # that opened the channel may write, or lines would arrive twice.
        if os.getpid() != self._pid or self.pending:
            return
        with self._lock:
            lines, self._lines = self._lines, []
            self._last_flush = self._clock()
            if not lines or self.broken:
                return
            data = ("\n".join(lines) + "\n").encode()
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError:  # the parent closed its end: keep training, stop reporting
                self.broken = True


class PhaseState:
    """One epoch x phase as the child sees it; ``seq`` numbers phases in this process."""

    __slots__ = ("ended", "epoch", "images", "phase", "seq", "steps", "warm")

    def __init__(self, seq: int, epoch: int, phase: str, warm: int) -> None:
        self.seq, self.epoch, self.phase, self.warm = seq, epoch, phase, warm
        self.steps = 0
        self.images = 0
        self.ended = False


class OpenStep:
    """The step being timed; times are ``perf_counter`` readings."""

    __slots__ = ("comm_s", "images", "other_s", "phase", "t_batch", "t_opt", "t_start",
                 "transfer_at_opt_s", "transfer_s")

    def __init__(self, phase: PhaseState, t_start: float, t_batch: float, images: int) -> None:
        self.phase, self.t_start, self.t_batch, self.images = phase, t_start, t_batch, images
        self.transfer_s = 0.0
        self.comm_s = 0.0  # gradient all-reduce in flight (DDP, see stepscope_watch_dist)
        self.t_opt: float | None = None
        self.transfer_at_opt_s = 0.0
        self.other_s = 0.0  # measured loop overhead (Keras: the user's batch callbacks)


class Recorder:
    """Step, phase and fact bookkeeping shared by the framework hooks of one process.

    Args:
        channel: where records go.
        clock: monotonic clock for durations; records carry Unix time.
    """

    def __init__(self, channel: Channel, clock: Callable[[], float] = time.perf_counter) -> None:
        self.channel = channel
        self.clock = clock
        self.pid = os.getpid()
        self.main_thread_id = threading.get_ident()
        self._offset = time.time() - clock()
        # Epochs are numbered from 1, as Keras ("Epoch 1/2"), Lightning's progress bar,
        # metrics.csv and `stepscope train` print them; 0 is validation before any training.
        self.epoch = 0
        self._seq = 0
        self._warm_phases: set[str] = set()
        self.open_phases: list[PhaseState] = []
        self.step: OpenStep | None = None
        # Loader stage counters (stepscope_watch_stages.WatchPhases), set by sitecustomize.
        self.stages: Any = None
        # per open phase: its loader's workers and persistent_workers (None: not known)
        self._phase_workers: dict[int, tuple[int | None, bool | None]] = {}
        self.framework_depth = 0  # > 0 inside Keras/Lightning loops: their callbacks time steps
        self.last_mode_eval = False  # the last outermost nn.Module.train(mode) call had mode False
        self.train_depth = 0
        self.roots: weakref.WeakSet[Any] = weakref.WeakSet()
        # The torch hooks' first-step memory measurement (saved for backward, step peak) starts
        # here; a framework loop whose batches bypass the timed DataLoader calls it per batch.
        self.train_batch_arrived: Callable[[Any], None] = lambda batch: None
        self.periodic: list[Callable[[], None]] = []
        self._last_periodic = clock()
        self._sent: set[str] = set()
        self._seen_datasets: set[int] = set()
        self.cb_phase: PhaseState | None = None
        self._cb_mark = 0.0
        self.cb_images: Callable[[int, int], int] = lambda first, last: 0
        self._cb_first = 0
        self._cb_copy: tuple[float, float] | None = None  # (start, seconds) before batch begin
        self._cb_outer: tuple[PhaseState | None, Callable[[int, int], int]] | None = None
        self.at_exit_hooks: list[Callable[[float], None]] = []  # e.g. the loop tracker's flush
        self.rss_marks: dict[str, int] = {}  # RSS at named moments (the memory ledgers')
        self._saving = False  # a checkpoint write is being timed (timed_save)

    # -- plumbing ------------------------------------------------------------------------------
    def unix(self, t: float) -> float:
        return t + self._offset

    def send(self, msg: list[Any], *, urgent: bool = False) -> None:
        self.channel.send(msg, urgent=urgent)

    def once(self, key: str) -> bool:
        """True the first time ``key`` is asked for (one-off notes and facts)."""
        if key in self._sent:
            return False
        self._sent.add(key)
        return True

    def note(self, source: str, text: str) -> None:
        self.send(["N", source, text])

    def fact(self, key: str, value: Any, how: str) -> None:
        self.send(["F", key, value, how])

    def owner(self) -> bool:
        """True in the process that opened the pipe (not in a forked worker)."""
        return os.getpid() == self.pid

    def timed_save(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        """``orig`` (a function or method that writes a checkpoint: ``torch.save``, Keras's
        ``Model.save``/``save_weights``, Lightning's ``Trainer.save_checkpoint``) timed. Its time
        goes to no step or phase (it runs between them), so each write is one
        ``trainer/checkpoint_write_s`` sample (stepscope.metrics) at its end, as ``stepscope
        train`` records its own; a write inside another (Lightning's ``torch.save``) is its."""
        def save(*args: Any, **kwargs: Any) -> Any:
            if self._saving or not self.owner():
                return orig(*args, **kwargs)
            self._saving = True
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                self._saving = False
                self.checkpoint_written(time.time(), time.perf_counter() - t0)

        save.__name__, save.__doc__ = orig.__name__, orig.__doc__
        save.__wrapped__ = orig  # type: ignore[attr-defined]
        return save

    def runtime_baseline(self, rss: int, how: str) -> None:
        """RSS once a framework finished importing: the memory ledger's baseline (fact
        ``mem.runtime_baseline_bytes``) and the mark later RSS growth is measured from. A
        framework imported on top of another sends it again; the last one covers both."""
        self.rss_marks["import"] = rss
        self.fact("mem.runtime_baseline_bytes", rss, how)

    def checkpoint_written(self, end: float, seconds: float) -> None:
        """One checkpoint write that ended at ``end`` (Unix time) after ``seconds``."""
        self.send(["M", end, "trainer", "checkpoint_write_s", seconds])

    # -- phases --------------------------------------------------------------------------------
    def begin_phase(self, phase: str, workers: int | None, t: float, *,
                    same_epoch: bool = False, persistent: bool | None = None,
                    numbered: int | None = None) -> PhaseState:
        """Open a phase at ``t``. A new train phase is a new epoch (unless ``same_epoch``: training
        resumed after its phase was closed); val belongs to the current one. ``numbered``: the
        loop's own number for a new train phase's epoch, as it prints it (Keras's "Epoch 6/10"
        for ``fit(initial_epoch=5)``), never below the next one here: a second ``fit()`` that
        counts from 1 again keeps its epochs apart from the first's.

        Phases left open by a loop that broke out early are closed here: every open val phase,
        and every open train phase when a new train phase starts (a val loop nested in a train
        loop leaves the train phase open, so its later steps still find it).
        """
        self.end_step(t)
        for ph in list(self.open_phases):
            if ph.phase == "val" or phase == "train":
                self.end_phase(ph, t)
        if phase == "train" and not same_epoch:
            self.epoch = max(self.epoch + 1, numbered or 0)
        epoch = self.epoch
        warm = 0 if phase in self._warm_phases else WARMUP_STEPS
        self._warm_phases.add(phase)
        ph = PhaseState(self._seq, epoch, phase, warm)
        self._seq += 1
        self.open_phases.append(ph)
        self.send(["P", ph.seq, epoch, phase, self.unix(t), workers], urgent=True)
        if self.stages is not None:
            self.stages.begin(ph.seq)
            self._phase_workers[ph.seq] = (workers, persistent)
        return ph

    def warm_again(self, phases: tuple[str, ...]) -> None:
        """The next phase of each kind in ``phases`` starts with warm-up steps again, as the
        process's first did: its loop traces (and compiles) a new step function."""
        self._warm_phases.difference_update(phases)

    def end_phase(self, ph: PhaseState, t: float) -> None:
        if ph.ended:
            return
        if self.step is not None and self.step.phase is ph:
            self.end_step(t)
        ph.ended = True
        if ph in self.open_phases:
            self.open_phases.remove(ph)
        if self.stages is not None:
            found = self.stages.end(ph.seq, *self._phase_workers.pop(ph.seq, (None, None)))
            if found is not None:
                self.fact(f"stages.seq.{ph.seq}", found, "loader stage counters over the phase")
        self.send(["E", ph.seq, self.unix(t), ph.steps, ph.images], urgent=True)

    # -- steps ---------------------------------------------------------------------------------
    def begin_step(self, ph: PhaseState, t_start: float, t_batch: float, images: int) -> None:
        self.step = OpenStep(ph, t_start, t_batch, images)

    def end_step(self, t: float) -> None:
        """Close the open step at ``t`` (the start of the next data wait) and send it."""
        s = self.step
        if s is None:
            return
        self.step = None
        ph = s.phase
        wall = max(t - s.t_start, 0.0)
        wait = max(s.t_batch - s.t_start, 0.0)
        if s.t_opt is not None and ph.phase == "train":
            compute = max(s.t_opt - s.t_batch - s.transfer_at_opt_s, 0.0)
        else:
            compute = max(wall - wait - s.transfer_s - s.other_s, 0.0)
        other = max(wall - wait - s.transfer_s - compute, 0.0)
        comm = min(s.comm_s, compute)  # taken out of compute, as `stepscope train` does
        self.send_step(ph, s.t_start, wall, wait, s.transfer_s, compute - comm, other, s.images,
                       comm)
        self.tick(t)

    def send_step(self, ph: PhaseState, t_start: float, wall: float, wait: float,
                  transfer: float, compute: float, other: float, images: int,
                  comm: float = 0.0) -> None:
        """Send a step whose split is known (the one place a step record is made). A loop that
        splits its steps itself (Keras's) calls this directly, with :meth:`tick` after."""
        index = ph.steps
        ph.steps += 1
        ph.images += images
        self.send(["S", ph.seq, index, self.unix(t_start), wall, wait, transfer, compute,
                   other, images, index < ph.warm, comm])

    def tick(self, t: float) -> None:
        """At a step boundary: the periodic readings, at most every ``PERIODIC_EVERY_S``."""
        if t - self._last_periodic >= PERIODIC_EVERY_S:
            self._last_periodic = t
            for fn in self.periodic:
                try:
                    fn()
                except Exception as exc:  # a telemetry read must never break training
                    self.periodic.remove(fn)
                    self.note("watch", f"periodic reading disabled: {type(exc).__name__}: {exc}")

    def add_transfer(self, dt: float) -> None:
        if self.step is not None:
            self.step.transfer_s += dt

    def add_comm(self, dt: float) -> None:
        """All-reduce time of the open step (called on the process group's thread)."""
        s = self.step
        if s is not None:
            s.comm_s += dt

    def optimizer_stepped(self, t: float) -> None:
        s = self.step
        if s is not None:
            s.t_opt = t
            s.transfer_at_opt_s = s.transfer_s

    # -- callback-driven loops (Keras, Lightning) ---------------------------------------------
    def cb_phase_begin(self, phase: str, images: Callable[[int, int], int]) -> None:
        """A framework loop starts a phase; ``images(first, last)`` counts a batch's images."""
        t = self.clock()
        if self.cb_phase is not None:
            self.end_phase(self.cb_phase, t)
        self.cb_phase = self.begin_phase(phase, None, t)
        self.cb_images = images
        self._cb_mark = t
        self._cb_copy = None

    def cb_nested_begin(self, phase: str, images: Callable[[int, int], int]) -> None:
        """A phase inside the open one (Lightning's validation every N training batches): the
        outer phase stays open and its steps resume after :meth:`cb_nested_end`."""
        t = self.clock()
        self.end_step(t)
        self._cb_outer = (self.cb_phase, self.cb_images)
        self.cb_phase = self.begin_phase(phase, None, t)  # a val phase closes only val phases
        self.cb_images = images
        self._cb_mark = t
        self._cb_copy = None

    def cb_nested_end(self) -> None:
        t = self.clock()
        if self.cb_phase is not None:
            self.end_phase(self.cb_phase, t)
        outer, self._cb_outer = self._cb_outer, None
        self.cb_phase = None
        if outer is not None and outer[0] is not None and not outer[0].ended:
            self.cb_phase, self.cb_images = outer
        self._cb_mark = t  # the validation's time is no training step's data wait
        self._cb_copy = None

    def cb_saved(self) -> None:
        """The framework has written a checkpoint since the last step, validation or phase
        ended, and says so only now (Hugging Face's ``on_save``): the time since (its logging
        and the write) is a checkpoint write, as ``timed_save`` records one, and no part of the
        next step's data wait."""
        t = self.clock()
        if self._cb_mark and t > self._cb_mark:
            self.checkpoint_written(self.unix(t), t - self._cb_mark)
        self._cb_mark = t

    def cb_phase_end(self) -> None:
        if self.cb_phase is not None:
            self.end_phase(self.cb_phase, self.clock())
            self.cb_phase = None

    def cb_transfer(self, t0: float, dt: float) -> None:
        """The framework copied the next batch to the device from ``t0`` for ``dt`` seconds,
        before its batch-begin callback (Lightning's ``batch_to_device``): the data wait ends
        where the first copy began, and the copies are the step's transfer."""
        if self.cb_phase is None or self.step is not None:
            return  # no phase (sanity check), or a copy inside the step: not the batch's
        start, spent = self._cb_copy if self._cb_copy is not None else (t0, 0.0)
        self._cb_copy = (start, spent + dt)

    def cb_batch_begin(self, first: int) -> None:
        t = self.clock()
        if self.cb_phase is None:
            return
        self.end_step(t)
        self._cb_first = first
        copy, self._cb_copy = self._cb_copy, None
        if copy is not None and self._cb_mark <= copy[0] <= t:
            self.step = OpenStep(self.cb_phase, self._cb_mark, copy[0], 0)
            self.step.transfer_s = min(copy[1], t - copy[0])
        else:
            self.begin_step(self.cb_phase, self._cb_mark, t, 0)

    def cb_batch_end(self, last: int, images: int | None = None) -> None:
        t = self.clock()
        if self.step is None or self.step.phase is not self.cb_phase:
            return
        self.step.images = self.cb_images(self._cb_first, last) if images is None else images
        self.end_step(t)
        self._cb_mark = t

    # -- datasets and exit ----------------------------------------------------------------------
    def dataset_files(self, dataset: Any,
                      find: Callable[[Any], list[str]] | None = None) -> None:
        """Send the files of a file-backed dataset once: ``find(dataset)``, by default
        ImageFolder-style ``samples`` (``find_dataset_files``)."""
        if id(dataset) in self._seen_datasets:
            return
        self._seen_datasets.add(id(dataset))
        files = (find or find_dataset_files)(dataset)
        if files:
            self.send(["D", files[:MAX_DATASET_FILES]], urgent=True)

    def at_exit(self) -> None:
        if not self.owner():
            return
        t = self.clock()
        self.end_step(t)
        for hook in self.at_exit_hooks:
            try:
                hook(t)
            except Exception as exc:  # what was recorded so far must still reach the parent
                self.note("watch", f"closing the loop failed: {type(exc).__name__}: {exc}")
        for ph in list(self.open_phases):
            self.end_phase(ph, t)
        # An orderly exit (normal end, sys.exit, an uncaught exception): the parent tells it
        # from a process killed by a signal, which never gets here.
        self.send(["B"])
        self.channel.flush()


def find_dataset_files(dataset: Any, depth: int = 0) -> list[str]:
    """Paths of a dataset's files: torchvision ``DatasetFolder``/``ImageFolder`` (``samples``),
    through ``Subset`` (``dataset``, only its ``indices``) and ``ConcatDataset``
    (``datasets``). Empty if unknown."""
    if depth > 4:
        return []
    samples = getattr(dataset, "samples", None)
    if isinstance(samples, list) and samples:
        first = samples[0]
        path = first[0] if isinstance(first, (tuple, list)) and first else first
        if isinstance(path, str) and os.path.isfile(path):
            return [s[0] if isinstance(s, (tuple, list)) else s for s in samples]
    inner = getattr(dataset, "datasets", None)
    if isinstance(inner, (list, tuple)):
        out: list[str] = []
        for d in inner:
            out += find_dataset_files(d, depth + 1)
        return out
    base = getattr(dataset, "dataset", None)
    if base is None:
        return []
    files = find_dataset_files(base, depth + 1)
    indices = getattr(dataset, "indices", None)
    if indices is None or not files:
        return files
    # A Subset reads only its indices' files: residency over the rest would say nothing.
    try:
        return [files[int(i)] for i in indices]
    except (TypeError, ValueError, IndexError):
        return files


def count_images(batch: Any) -> int:
    """Images in a batch: the length of its first tensor-like element (as Monitor counts)."""
    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    try:
        return len(first)
    except TypeError:
        return 1


def create_recorder(fd: int) -> Recorder:
    """The process's recorder on pipe ``fd``; flushes what is left at interpreter exit."""
    rec = Recorder(Channel(fd))
    atexit.register(rec.at_exit)
    rec.send(["H", os.getpid()], urgent=True)
    return rec
