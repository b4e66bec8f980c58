"""Stage timing inside the input pipeline: where one image's loading time goes.

Every process that loads data (the training process, each DataLoader worker) keeps its own
counters in a small memory-mapped file, one per process, in the folder named by the
``STEPSCOPE_STAGES_DIR`` environment variable (set by the Monitor before any worker starts,
so forked *and* spawned workers find it). Adding to a counter is a store into shared memory
(~0.1 µs); the training process reads every file at phase boundaries, so no queue, pipe or
pickling is added to the loader's own path, and a worker killed at the end of an epoch loses
nothing (the page is the record).

Stages (seconds are *exclusive*: a decode inside a transform is counted as decode only):

- ``item``      the dataset's ``__getitem__`` / iterator ``next`` as a whole, minus the stages below
- ``read``      reading the file (``Image.open`` on a path, ``torchvision.io.read_file``, the
  trainer's own read), with the bytes read
- ``decode``    ``Image.load``, ``cv2.imread``/``imdecode``, ``torchvision.io.decode_*``
- ``transform`` ``transforms.Compose.__call__`` (or the trainer's augmentation)
- ``collate``   the DataLoader's ``collate_fn``
- ``pin``       ``pin_memory`` (the pin thread, or the main process with ``workers=0``)

Per batch (one ``fetch`` of the DataLoader), the fetching thread's scheduler figures from
``/proc/thread-self/schedstat`` split its wall time into on-CPU, waiting for a CPU (run
queue: the cores were busy) and blocked (disk, network, sleeps): the evidence that separates
storage from CPU from too few workers.

Loading *threads* of the training process (a Keras ``PyDataset(workers=N,
use_multiprocessing=False)`` thread pool) share its board, so each keeps its own row as well
(``ThreadTimer``): busy wall, on-CPU and run-queue seconds per thread, added to the phase's
``workers`` rows with the thread's id and name.

This module imports only the standard library: ``watch`` loads it into the user's own
interpreter (as ``stepscope_watch_stages``), and the Monitor uses it as
``stepscope.observe.stages``.

The hooks that feed these counters (torch, PIL, OpenCV, torchvision, spawned workers) are in
``stepscope_watch_stage_hooks``.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_DIR = "STEPSCOPE_STAGES_DIR"
STAGES = ("item", "read", "decode", "transform", "collate", "pin")

# Slot layout of one process's counter file (float64 each).
PID, T_UPDATE, BATCHES, ITEMS, FETCH_S, FETCH_CPU_S, FETCH_RUNQ_S, READ_BYTES = range(8)
_STAGE0 = 8  # then (seconds, calls) per stage
SLOTS = _STAGE0 + 2 * len(STAGES)
_STAGE_INDEX = {name: _STAGE0 + 2 * i for i, name in enumerate(STAGES)}


class _Board:
    """This process's counters: a float64 view over its memory-mapped file."""

    def __init__(self, folder: str) -> None:
        self.pid = os.getpid()
        self.folder = folder
        path = Path(folder) / f"{self.pid}.stages"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOTS * 8)
            self._mm = mmap.mmap(fd, SLOTS * 8)
        finally:
            os.close(fd)
        self.v = memoryview(self._mm).cast("d")
        self.v[PID] = float(self.pid)
        self.local = threading.local()

    def push(self) -> None:
        """Open a timed region on this thread: its slot collects the time of regions inside it
        (a stage inside a batch), which the region's own time excludes."""
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        stack.append(0.0)


_board: _Board | None = None
_board_lock = threading.Lock()
# Read once at import (a spawned worker, or watch's child, gets it from its environment) and
# set by the Monitor; a per-call environment lookup would cost more than the hook itself.
_folder: str | None = os.environ.get(ENV_DIR) or None


def _forget_board() -> None:
    # A forked child must not write into its parent's page, nor read its parent's thread's
    # scheduler figures: it opens its own on first use. Its lock is new too: a lock another
    # thread held at the fork stays held in the child, where that thread does not exist (a
    # Keras pool worker forked while the loop's thread made its board hung in ``board()``).
    global _board, _sched_fds, _board_lock
    _board = None
    _sched_fds = threading.local()
    _board_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_board)


def renew_lock_after_fork(owner: object, attr: str) -> None:
    """In a forked child, give ``owner.<attr>`` a new lock.

    A lock some thread held at the fork stays held in the child, where that thread does not
    exist. The handler holds only a weak reference: it keeps no owner alive.
    """
    ref = weakref.ref(owner)

    def renew() -> None:
        if (o := ref()) is not None:
            setattr(o, attr, threading.Lock())

    os.register_at_fork(after_in_child=renew)


def set_folder(folder: str | None) -> None:
    """Start (a folder) or stop (None) counting in this process and in workers started later."""
    global _folder
    _folder = folder
    if folder is None:
        os.environ.pop(ENV_DIR, None)
    else:
        os.environ[ENV_DIR] = folder


def board() -> _Board | None:
    """This process's board, created on first use (a forked child makes its own)."""
    global _board
    b = _board
    if b is not None and b.folder == _folder:
        return b
    if _folder is None:
        return None
    with _board_lock:
        if _board is None or _board.folder != _folder:
            try:
                _board = _Board(_folder)
            except OSError:
                return None
        return _board


class Stage:
    """Times one stage exclusively (nested stages are subtracted from their parent).

    Examples:
        >>> with Stage("read", nbytes=1024):
        ...     data = b"x" * 1024
    """

    __slots__ = ("_b", "_t0", "name", "nbytes")

    def __init__(self, name: str, nbytes: int = 0) -> None:
        self.name = name
        self.nbytes = nbytes
        self._b: _Board | None = None
        self._t0 = 0.0

    def __enter__(self) -> Stage:
        b = self._b = board()
        if b is not None:
            b.push()
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        b = self._b
        if b is None:
            return
        dt = time.perf_counter() - self._t0
        stack: list[float] = b.local.stack
        children = stack.pop()
        if stack:
            stack[-1] += dt
        i = _STAGE_INDEX[self.name]
        b.v[i] += max(0.0, dt - children)
        b.v[i + 1] += 1.0
        if self.nbytes:
            b.v[READ_BYTES] += self.nbytes


def add_bytes(nbytes: int) -> None:
    """Count ``nbytes`` read by the current process (when the read itself is timed elsewhere)."""
    b = board()
    if b is not None:
        b.v[READ_BYTES] += nbytes


def timed(name: str, fn: Callable[..., Any], nbytes: Callable[..., int] | None = None
          ) -> Callable[..., Any]:
    """``fn`` wrapped so each call counts as stage ``name`` (idempotent)."""
    if getattr(fn, "_stepscope_stage", None):
        return fn

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        n = 0
        if nbytes is not None:
            try:
                n = nbytes(*args, **kwargs)
            except Exception:  # a size is a nicety, never a reason to fail the read
                n = 0
        with Stage(name, n):
            return fn(*args, **kwargs)

    wrapper._stepscope_stage = name  # type: ignore[attr-defined]
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


_sched_fds = threading.local()  # per thread: its own schedstat file, opened once


def thread_sched() -> tuple[float, float]:
    """(CPU s, run-queue wait s) of the calling thread; (CPU, 0) without schedstat.

    The CPU figure is the thread's CPU clock, not schedstat's on-CPU field: the kernel brings
    that field up to date only at scheduler events and ticks, so a running thread reading its
    own lags by up to a tick, and a bracket that starts just after a wake-up (fresh) and ends
    after CPU work (stale) reads low. The run-queue wait is final while the thread runs."""
    cpu = time.thread_time()
    fd = getattr(_sched_fds, "fd", None)
    try:
        if fd is None:
            # /proc/thread-self names the opening thread: the descriptor stays this thread's.
            fd = _sched_fds.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        return cpu, int(os.pread(fd, 96, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        _sched_fds.fd = None
        return cpu, 0.0


def _clocks() -> tuple[float, float, float]:
    """(wall, CPU, run-queue wait) of the calling thread now: one batch's bracket opens here."""
    cpu, rq = thread_sched()
    return time.perf_counter(), cpu, rq


def _since(t0: float, cpu0: float, rq0: float) -> tuple[float, float, float]:
    """(wall, CPU, run-queue wait) since the bracket ``_clocks`` opened."""
    t = time.perf_counter()
    cpu, rq = thread_sched()
    return t - t0, max(0.0, cpu - cpu0), max(0.0, rq - rq0)


class BatchTimer:
    """Times one DataLoader fetch (items + collate) with the thread's scheduler split."""

    __slots__ = ("_b", "_cpu0", "_rq0", "_t0", "items")

    def __init__(self, items: int) -> None:
        self.items = items
        self._b: _Board | None = None
        self._t0 = self._cpu0 = self._rq0 = 0.0

    def __enter__(self) -> BatchTimer:
        self._b = b = board()
        if b is not None:
            b.push()
            self._t0, self._cpu0, self._rq0 = _clocks()
        return self

    def __exit__(self, *exc: object) -> None:
        b = self._b
        if b is None:
            return
        dt, cpu, rq = _since(self._t0, self._cpu0, self._rq0)
        children = b.local.stack.pop()
        v = b.v
        # What the dataset's own code did outside any hooked stage counts as ``item``.
        v[_STAGE_INDEX["item"]] += max(0.0, dt - children)
        v[_STAGE_INDEX["item"] + 1] += float(self.items)
        v[BATCHES] += 1.0
        v[ITEMS] += float(self.items)
        v[FETCH_S] += dt
        v[FETCH_CPU_S] += cpu
        v[FETCH_RUNQ_S] += rq
        v[T_UPDATE] = time.time()


# ------------------------------------------------------------- loading threads of this process

# busy_s, cpu_s, runq_s, batches, items, item_s (exclusive of hooked stages) per loading thread
_BUSY, _CPU, _RUNQ, _BATCHES, _ITEMS, _ITEM_S = range(6)
# thread id -> (name, counters): written only by that thread, read by the phase boundaries.
_threads: dict[int, tuple[str, list[float]]] = {}
_open: dict[int, float] = {}  # thread id -> when its batch in progress began (0.0: idle)


def _forget_threads() -> None:
    _threads.clear()  # a forked pool process's threads are not its parent's loaders
    _open.clear()


def threads_busy_now() -> float:
    """The loading threads' busy seconds so far, each batch in progress counted up to now."""
    now = time.perf_counter()
    total = 0.0
    for tid, (_, row) in list(_threads.items()):
        t0 = _open.get(tid, 0.0)
        total += row[_BUSY] + (now - t0 if t0 else 0.0)
    return total


os.register_at_fork(after_in_child=_forget_threads)


class ThreadTimer:
    """Times one batch built on a loading *thread* of the training process (a Keras PyDataset
    with ``workers=N, use_multiprocessing=False`` runs ``__getitem__`` on a thread pool).

    The board counts per process, so threads would be one figure; here each thread keeps its
    own row: wall time inside the batch, its on-CPU and run-queue time (its own schedstat), so
    a thread waiting for Python's GIL shows as busy wall well above its CPU (a thread asleep on
    the GIL is neither on a CPU nor runnable). Each thread writes only its own row: no lock.
    """

    __slots__ = ("_b", "_cpu0", "_row", "_rq0", "_t0", "_tid", "items")

    def __init__(self, items: int) -> None:
        self.items = items
        self._b: _Board | None = None
        self._row: list[float] | None = None
        self._t0 = self._cpu0 = self._rq0 = 0.0
        self._tid = 0

    def __enter__(self) -> ThreadTimer:
        if _folder is None:
            return self
        tid = threading.get_ident()
        entry = _threads.get(tid)
        if entry is None:
            entry = _threads[tid] = (threading.current_thread().name, [0.0] * 6)
        self._row = entry[1]
        self._b = b = board()
        if b is not None:
            b.push()  # hooked stages inside (a decode) are subtracted from ``item``
        self._t0, self._cpu0, self._rq0 = _clocks()
        _open[tid] = self._t0
        self._tid = tid
        return self

    def __exit__(self, *exc: object) -> None:
        row = self._row
        if row is None:
            return
        # The busy time lands and the open batch closes in two adjacent bytecodes, before
        # schedstat's read releases the GIL: a reader (the loop, at each step) sees one or the
        # other, not neither for the length of a system call.
        dt = time.perf_counter() - self._t0
        row[_BUSY] += dt
        _open[self._tid] = 0.0
        cpu, rq = thread_sched()
        cpu, rq = max(0.0, cpu - self._cpu0), max(0.0, rq - self._rq0)
        children = self._b.local.stack.pop() if self._b is not None else 0.0
        row[_CPU] += cpu
        row[_RUNQ] += rq
        row[_BATCHES] += 1.0
        row[_ITEMS] += float(self.items)
        row[_ITEM_S] += max(0.0, dt - children)


def read_threads() -> dict[int, tuple[str, list[float]]]:
    """Every loading thread's counters now (copies)."""
    return {tid: (name, list(row)) for tid, (name, row) in list(_threads.items())}


def thread_rows(before: dict[int, tuple[str, list[float]]],
                after: dict[int, tuple[str, list[float]]], pid: int
                ) -> tuple[list[dict[str, float | int | str]], list[float]]:
    """The loading threads' work between two readings: one ``workers`` row each (as a worker
    process's, with its thread id and name) and their sums (the counters' slots)."""
    rows: list[dict[str, float | int | str]] = []
    total = [0.0] * 6
    for tid, (name, now) in after.items():
        was = before.get(tid, ("", [0.0] * 6))[1]
        d = [a - b for a, b in zip(now, was, strict=True)]
        if d[_BATCHES] <= 0:
            continue
        rows.append({"pid": pid, "tid": tid, "thread": name, "busy_s": d[_BUSY],
                     "cpu_s": d[_CPU], "runq_s": d[_RUNQ], "batches": d[_BATCHES],
                     "items": d[_ITEMS]})
        total = [t + x for t, x in zip(total, d, strict=True)]
    return rows, total


# --------------------------------------------------------------------------- reading boards


@dataclass
class ProcessStages:
    """One process's counters at one moment (cumulative since it started)."""

    pid: int
    batches: float = 0.0
    items: float = 0.0
    fetch_s: float = 0.0
    fetch_cpu_s: float = 0.0
    fetch_runq_s: float = 0.0
    read_bytes: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    stage_calls: dict[str, float] = field(default_factory=dict)

    def minus(self, before: ProcessStages | None) -> ProcessStages:
        if before is None:
            return self
        return ProcessStages(
            self.pid, self.batches - before.batches, self.items - before.items,
            self.fetch_s - before.fetch_s, self.fetch_cpu_s - before.fetch_cpu_s,
            self.fetch_runq_s - before.fetch_runq_s, self.read_bytes - before.read_bytes,
            {k: v - before.stage_s.get(k, 0.0) for k, v in self.stage_s.items()},
            {k: v - before.stage_calls.get(k, 0.0) for k, v in self.stage_calls.items()},
        )


def read_boards(folder: Path) -> dict[int, ProcessStages]:
    """Every process's counters in ``folder`` now."""
    out: dict[int, ProcessStages] = {}
    try:
        names = list(Path(folder).glob("*.stages"))
    except OSError:
        return out
    for path in names:
        try:
            raw = memoryview(path.read_bytes()).cast("d")
        except (OSError, TypeError):
            continue
        if len(raw) < SLOTS:
            continue
        ps = ProcessStages(
            int(raw[PID]), raw[BATCHES], raw[ITEMS], raw[FETCH_S], raw[FETCH_CPU_S],
            raw[FETCH_RUNQ_S], raw[READ_BYTES],
            {s: raw[_STAGE_INDEX[s]] for s in STAGES},
            {s: raw[_STAGE_INDEX[s] + 1] for s in STAGES},
        )
        out[ps.pid] = ps
    return out


def phase_stages(before: dict[int, ProcessStages], after: dict[int, ProcessStages],
                 # free-form: the stages.phase.<id> fact, a JSON record analysis/capacity.py parses by key
                 main_pid: int) -> dict[str, Any]:
    """What the loaders did between two readings, as a plain dict (stored as a fact).

    ``workers`` lists each other process's busy time (seconds inside fetches) in the window.
    """
    total = ProcessStages(0, stage_s=dict.fromkeys(STAGES, 0.0),
                          stage_calls=dict.fromkeys(STAGES, 0.0))
    workers: list[dict[str, float]] = []
    main: dict[str, float] = {}
    for pid, now in after.items():
        d = now.minus(before.get(pid))
        total.batches += d.batches
        total.items += d.items
        total.fetch_s += d.fetch_s
        total.fetch_cpu_s += d.fetch_cpu_s
        total.fetch_runq_s += d.fetch_runq_s
        total.read_bytes += d.read_bytes
        for s in STAGES:
            total.stage_s[s] += d.stage_s.get(s, 0.0)
            total.stage_calls[s] += d.stage_calls.get(s, 0.0)
        row = {"pid": pid, "busy_s": d.fetch_s, "cpu_s": d.fetch_cpu_s,
               "runq_s": d.fetch_runq_s, "batches": d.batches, "items": d.items}
        if pid == main_pid:
            main = {**row, "pin_s": d.stage_s.get("pin", 0.0),
                    "collate_s": d.stage_s.get("collate", 0.0)}
        elif d.batches > 0:
            workers.append(row)
    return {
        "batches": total.batches, "items": total.items, "fetch_s": total.fetch_s,
        "fetch_cpu_s": total.fetch_cpu_s, "fetch_runq_s": total.fetch_runq_s,
        "read_bytes": total.read_bytes,
        "stage_s": total.stage_s, "stage_calls": total.stage_calls,
        "workers": workers, "main": main,
    }


# A batch that was ready came back from the loader's ``__next__`` in well under a millisecond
# (a queue get of a prepared batch); a longer wait means the step found none ready.
NOT_READY_S = 0.001


class LoaderProbe:
    """One phase of the loop as the loader's consumer sees it, plus what every loader did.

    The training loop calls :meth:`waited` after each ``next(loader)`` with the wall and this
    thread's CPU time spent inside it: with ``workers=0`` that CPU time *is* the loading work,
    read from the loading thread itself and only during data waits (never the whole process,
    whose compute threads would otherwise count as loading).
    """

    def __init__(self, folder: str | Path | None, main_pid: int) -> None:
        self.folder = None if folder is None else Path(folder)
        self.main_pid = main_pid
        self._before: dict[int, ProcessStages] = {}
        self._first: dict[int, ProcessStages] | None = None
        self.waits = 0
        self.wait_s = 0.0
        self.wait_cpu_s = 0.0
        self.not_ready = 0
        self.first_wait_s: float | None = None
        self.wait_cpu_clocked_s: float | None = None

    def begin(self) -> None:
        self._before = read_boards(self.folder) if self.folder is not None else {}

    def waited(self, wall_s: float, cpu_s: float) -> None:
        if self.first_wait_s is None:
            self.first_wait_s = wall_s
            # The first batch pays one-off costs (worker start-up, lazy imports, first-touch
            # allocations); rates are read from the counters after it.
            self._first = read_boards(self.folder) if self.folder is not None else {}
        self.waits += 1
        self.wait_s += wall_s
        self.wait_cpu_s += cpu_s
        if wall_s > NOT_READY_S:
            self.not_ready += 1

    def set_waits(self, waits: int, wait_s: float, wait_cpu_s: float, not_ready: int,
                  clocked_s: float | None) -> None:
        """The phase's totals, when the loop counted its waits itself (the Monitor: one call per
        phase instead of one per step); ``clocked_s`` is the wait whose CPU was read, the rest
        estimated."""
        self.waits, self.wait_s, self.wait_cpu_s, self.not_ready = waits, wait_s, wait_cpu_s, \
            not_ready
        self.wait_cpu_clocked_s = clocked_s

    # free-form: a JSON record written as a fact, read by key (analysis/capacity.py)
    def end(self, workers: int | None, persistent: bool | None) -> dict[str, Any]:
        after = read_boards(self.folder) if self.folder is not None else {}
        out = phase_stages(self._before, after, self.main_pid)
        if self._first is not None:
            steady = phase_stages(self._first, after, self.main_pid)
            out["steady"] = {k: steady[k] for k in (
                "batches", "items", "fetch_s", "fetch_cpu_s", "fetch_runq_s", "stage_s")}
        out.update({"loader_workers": workers, "persistent_workers": persistent,
                    "waits": self.waits, "wait_s": self.wait_s, "wait_cpu_s": self.wait_cpu_s,
                    "not_ready_steps": self.not_ready, "first_wait_s": self.first_wait_s,
                    "wait_cpu_clocked_s": self.wait_cpu_clocked_s,
                    # The loop-side figures hold even when no loader process wrote counters
                    # (workers started with ``spawn`` outside ``watch`` have no hooks).
                    "stages_measured": self.folder is not None})
        return out


SEQ_FACT_PREFIX = "stages.seq."  # watch: the child's phase number; the parent maps it to an id


class WatchPhases:
    """``watch``'s side of the probe: counters read when the child's recorder opens a phase
    (after its first step: ``watch`` opens phases once a step is classified, so the first
    batch's one-off costs fall before the reading) and when it closes it."""

    def __init__(self) -> None:
        self.folder = Path(_folder) if _folder else None
        self._open: dict[int, dict[int, ProcessStages]] = {}
        self._threads: dict[int, dict[int, tuple[str, list[float]]]] = {}
        self.wait_cpu_s = 0.0  # this thread's CPU inside the loader's __next__, all phases

    def begin(self, seq: int) -> None:
        if self.folder is not None:
            self._open[seq] = read_boards(self.folder)
            self._threads[seq] = read_threads()
        self._cpu0 = self.wait_cpu_s

    # free-form: a JSON record written as a fact, read by key (analysis/capacity.py)
    def end(self, seq: int, workers: int | None, persistent: bool | None = None
            ) -> dict[str, Any] | None:
        before = self._open.pop(seq, None)
        threads = self._threads.pop(seq, {})
        if before is None or self.folder is None:
            return None
        out = phase_stages(before, read_boards(self.folder), os.getpid())
        rows, t = thread_rows(threads, read_threads(), os.getpid())
        if rows:  # threads of this process: rows of their own, and in the totals
            out["workers"] = out["workers"] + rows
            out["worker_threads"] = True
            out["batches"] += t[_BATCHES]
            out["items"] += t[_ITEMS]
            out["fetch_s"] += t[_BUSY]
            out["fetch_cpu_s"] += t[_CPU]
            out["fetch_runq_s"] += t[_RUNQ]
            out["stage_s"]["item"] += t[_ITEM_S]
            out["stage_calls"]["item"] += t[_ITEMS]
        out.update({"loader_workers": workers, "persistent_workers": persistent,
                    "wait_cpu_s": self.wait_cpu_s - self._cpu0, "stages_measured": True})
        return out
