"""TensorBoard files written while a run is recorded (``train``/``watch --tensorboard DIR``).

A background thread reads what the run database has gained every few seconds (new steps, new
samples) and appends it to one event file, so ``tensorboard --logdir DIR`` shows the run as it
goes; at the end the per-phase figures and the words (verdicts, findings, explanation), which
only exist once the run is analysed, are added to the same file. It only reads the database
(the recording process stays its one writer) and runs at the lowest cost that keeps the view
current: one indexed query for new steps and one per exported series each poll.

Step points are the same as ``report --tensorboard`` writes; sampled series are per-second means
of the raw samples (the after-the-fact export averages the report's time buckets per second).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stepscope.analysis.contracts_summary import Summary
from stepscope.errors import StepscopeError
from stepscope.render.tensorboard import (
    EventWriter,
    sampled_tags,
    write_phases,
    write_step,
    write_texts,
)
from stepscope.store.db import RunReader
from stepscope.store.rundir import RunDir

POLL_S = 5.0
# Samples are read up to this far behind now: the writer commits about once a second, so a
# second read sooner could still gain samples after its mean was written.
SETTLE_S = 3.0


class LiveTensorBoard:
    """Follows ``run_dir``'s database into TensorBoard event files in ``log_dir``.

    Examples:
        >>> live = LiveTensorBoard(Path("runs/mine"), Path("tb/mine")).start()
        >>> ...  # the run records
        >>> live.finish(summary, answers)
    """

    def __init__(self, run_dir: Path, log_dir: Path, *, poll_s: float = POLL_S) -> None:
        self.run_dir, self.log_dir, self.poll_s = Path(run_dir), Path(log_dir), poll_s
        self._ev: EventWriter | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_row = 0
        self._counters: dict[str, int] = {}
        self._samples_until: float | None = None
        self._t0: float | None = None
        self.errors: list[str] = []

    def start(self) -> LiveTensorBoard:
        self._ev = EventWriter(self.log_dir)
        self._thread = threading.Thread(target=self._loop, name="stepscope-tensorboard",
                                        daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll(settle_s=SETTLE_S)

    def poll(self, settle_s: float | None = SETTLE_S) -> None:
        """Append what the database gained since the last poll (nothing if it is not there).

        Samples are taken up to ``settle_s`` before now; with ``settle_s`` None, all of them
        (the run has ended). A sample committed later than ``settle_s`` after it was taken is
        not exported live (the writer commits about once a second).
        """
        if self._ev is None or not RunDir(self.run_dir).has_store():
            return
        with self._lock:
            try:
                with RunReader(self.run_dir) as reader:
                    self._new_steps(reader)
                    self._new_samples(reader, math.inf if settle_s is None
                                      else time.time() - settle_s)
                self._ev.flush()
            except (StepscopeError, OSError, ValueError) as exc:  # never break the run
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _new_steps(self, reader: RunReader) -> None:
        assert self._ev is not None
        rows = reader.steps_after(self._last_row)
        if not rows:
            return
        kinds = {p.phase_id: p.phase for p in reader.phases()}
        for rowid, s in rows:
            kind = kinds.get(s.phase_id, "train")
            index = self._counters.get(kind, 0)
            self._counters[kind] = index + 1
            write_step(self._ev, kind, index,
                       (s.data_wait_s, s.transfer_s, s.compute_s + (s.comm_s or 0.0), s.other_s),
                       s.images, s.wall_s, s.t_start + s.wall_s)
            self._last_row = rowid

    def _new_samples(self, reader: RunReader, until: float) -> None:
        assert self._ev is not None
        if self._t0 is None:
            self._t0 = reader.run().started or until
        # Windows end on whole seconds since the start, so each second's mean is written once.
        if math.isfinite(until):
            until = self._t0 + int(until - self._t0)
        since = self._samples_until if self._samples_until is not None else self._t0
        if until <= since:
            return
        gpus = reader.sources("util_pct")
        for st in sampled_tags(s for s in gpus if s.startswith("gpu")):
            ts, vs = reader.series(st.metric, st.source, since,
                                   until if math.isfinite(until) else None)
            for second, wall, mean in _per_second(ts, vs, self._t0, since, until):
                self._ev.scalar(st.tag, mean * st.scale, second, wall)
        self._samples_until = until

    def finish(self, summary: Summary, answers: Sequence[Any]) -> Path:
        """Stop following, add the last records, the per-phase figures and the words."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        self.poll(settle_s=None)  # the run has ended: everything is committed
        with self._lock:
            if self._ev is not None:
                write_phases(self._ev, summary.get("phases") or [])
                write_texts(self._ev, summary, answers, time.time())
                self._ev.close()
                self._ev = None
        return self.log_dir

    def stop(self) -> None:
        """Stop without the end-of-run figures (the run was never analysed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30.0)
        with self._lock, contextlib.suppress(OSError):
            if self._ev is not None:
                self._ev.close()
                self._ev = None


def _per_second(ts: list[float], vs: list[float], t0: float, since: float, until: float
                ) -> list[tuple[int, float, float]]:
    """``(second since t0, mean time, mean value)`` of the samples in ``[since, until)``."""
    acc: dict[int, list[float]] = {}
    for t, v in zip(ts, vs, strict=True):
        if not since <= t < until:  # series() includes both bounds
            continue
        row = acc.setdefault(int(t - t0), [0.0, 0.0, 0.0])
        row[0] += t
        row[1] += v
        row[2] += 1
    return [(s, r[0] / r[2], r[1] / r[2]) for s, r in sorted(acc.items())]
