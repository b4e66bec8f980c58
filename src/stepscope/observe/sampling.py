"""The sampler protocol, the factory that builds every sampler that works here, and the thread
that runs them at a fixed interval and hands their samples to the run writer.

Monitoring must never fail training: a sampler that cannot be built is a note; a sampler that
raises while sampling is disabled after one note; the thread itself never raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepscope.observe.base import NoteFn, Sampler, SamplerUnavailable, SampleSink
from stepscope.observe.disk import create_disk_samplers
from stepscope.observe.gpu import GpuSampler
from stepscope.observe.host import HostSampler
from stepscope.observe.pagecache import DatasetResidency
from stepscope.observe.proctree import ProcessTree
from stepscope.store.records import Sample


def create_samplers(
    *,
    root_pid: int,
    dataset_files: Sequence[Path] = (),
    gpu: bool | None = None,
    note: NoteFn,
) -> list[Sampler]:
    """Build every sampler that can work here; call ``note(source, reason)`` once per absent one.

    Args:
        root_pid: the process whose tree is observed (the trainer, or the command under watch).
        dataset_files: the dataset's files; they choose the disk to watch and the files checked
            for page-cache residency. Without them the disk holding the working directory is
            watched and residency is not sampled.
        gpu: False skips the GPU sampler silently; None or True try NVML and note its absence.
        note: where reasons go, usually ``RunWriter.note``.

    Returns:
        Samplers in sampling order: the process tree comes before the GPU sampler, which asks
        the tree for its PIDs.

    Examples:
        >>> samplers = create_samplers(root_pid=os.getpid(), note=writer.note)
        >>> thread = SamplerThread(samplers, writer); thread.start()
    """
    out: list[Sampler] = []

    def attempt(source: str, build: Callable[[], Sampler | Sequence[Sampler]]) -> None:
        try:
            built = build()
        except SamplerUnavailable as exc:
            note(source, str(exc))
            return
        if isinstance(built, Sequence):
            out.extend(built)
        else:
            out.append(built)

    attempt("host", HostSampler)
    tree: ProcessTree | None = None

    def build_tree() -> Sampler:
        nonlocal tree
        tree = ProcessTree(root_pid)
        return tree

    attempt("tree", build_tree)
    attempt("disk", lambda: create_disk_samplers(dataset_files))
    if dataset_files:
        attempt("pagecache", lambda: DatasetResidency(dataset_files))
    else:
        note("pagecache", "no dataset files given: dataset page-cache residency not sampled")
    if gpu is not False:
        pids = tree.pids if tree is not None else (lambda: {root_pid})
        attempt("gpu", lambda: GpuSampler(pids=pids, note=note))
    return out


class SamplerThread:
    """Runs samplers every ``interval_s`` on a daemon thread and writes what they return.

    ``clock`` stamps samples and drives rates; the wait between samples uses real time.
    ``cpu_s`` accumulates the thread CPU time spent sampling, per sampler in ``cost_s``: the
    monitor's own overhead, reportable as a fraction of the run.

    Examples:
        >>> thread = SamplerThread(create_samplers(root_pid=pid, note=w.note), w, interval_s=1.0)
        >>> thread.start(); ...; thread.stop()  # stop takes one final sample
    """

    def __init__(
        self,
        samplers: list[Sampler],
        writer: SampleSink,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.samplers = list(samplers)
        self.writer = writer
        self.interval_s = interval_s
        self.clock = clock
        self.samples_taken = 0
        self.cpu_s = 0.0
        self.cost_s: dict[str, float] = {s.name: 0.0 for s in self.samplers}
        self._disabled: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def find(self, kind: type) -> object | None:
        """The first sampler that is an instance of ``kind`` (e.g. ProcessTree), or None."""
        return next((s for s in self.samplers if isinstance(s, kind)), None)

    def start(self) -> None:
        """Start sampling in the background (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="stepscope-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and take one final sample, so the run ends on a fresh reading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 3 * self.interval_s))
            self._thread = None
        self.sample_once()

    def _loop(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            # Fixed-rate schedule; if sampling overran, skip ahead rather than burst to catch up.
            next_t = max(next_t + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def sample_once(self) -> None:
        """Run every enabled sampler once and hand the results to the writer (never raises)."""
        with self._lock:
            now = self.clock()
            batch: list[Sample] = []
            for i, sampler in enumerate(self.samplers):
                if i not in self._disabled:
                    batch += self._run_one(i, sampler, now)
            if batch:
                self.writer.add_samples(batch)
            self.samples_taken += 1

    def _run_one(self, index: int, sampler: Sampler, now: float) -> list[Sample]:
        t0 = time.thread_time()
        try:
            samples = sampler.sample(now)
            new_processes = getattr(sampler, "new_processes", None)
            if new_processes is not None:
                for proc in new_processes():
                    self.writer.put_process(proc)
        except Exception as exc:  # monitoring must never fail the training run
            self._disabled.add(index)
            self.writer.note(
                sampler.name,
                f"sampler disabled after an error while sampling: {type(exc).__name__}: {exc}",
            )
            samples = []
        spent = time.thread_time() - t0
        self.cpu_s += spent
        self.cost_s[sampler.name] = self.cost_s.get(sampler.name, 0.0) + spent
        return samples


def phase_io_totals(tree: Any) -> tuple[int | None, int | None]:
    """The process tree's (read_bytes, rchar) now, for a phase boundary; (None, None) when
    there is no tree sampler or it cannot read (its root may be gone): monitoring never breaks
    training."""
    if tree is None:
        return None, None
    try:
        rb, rc = tree.io_totals()
        return int(rb), int(rc)
    except Exception:
        return None, None


def phase_resident_frac(residency: Any) -> float | None:
    """The dataset's page-cache residency now, or None when it is not measured or unreadable."""
    if residency is None:
        return None
    try:
        return float(residency.resident_frac())
    except Exception:
        return None


__all__ = [
    "NoteFn",
    "SampleSink",
    "Sampler",
    "SamplerThread",
    "SamplerUnavailable",
    "create_samplers",
    "phase_io_totals",
    "phase_resident_frac",
]
