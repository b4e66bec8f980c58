"""The run database: SQLite in WAL mode, one writer thread, readable by other processes live.

The writer owns the only connection that writes. Callers on any thread hand it records through
a queue (a cheap ``put``), and the writer commits in batches at most ``commit_every_s`` apart,
so a run killed with SIGKILL loses at most that much. Each commit also refreshes the run's
heartbeat; a reader that finds a run still ``running`` whose process is gone marks it
``interrupted``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from stepscope.errors import StoreError
from stepscope.store import rollups, stepfold
from stepscope.store.queries import Aggregates, SeriesRows, Stat
from stepscope.store.records import (
    ArrivalRecord,
    Fact,
    Note,
    PhaseRecord,
    ProcessInfo,
    RunInfo,
    Sample,
    StepRecord,
)
from stepscope.store.rundir import DB_NAME
from stepscope.store.schema import PHASE_COLS, SCHEMA, SCHEMA_VERSION, STEP_COLS, connect

STEP_DRAIN_S = 0.1
LATEST_STEPS = 50  # steps kept for live views (RunWriter.latest_step_rows)
_STEP_ROW = operator.attrgetter(*STEP_COLS)
_T_START = STEP_COLS.index("t_start")


class RunWriter:
    """Owns the run database's write connection on a background thread.

    Examples:
        >>> w = RunWriter(Path("runs/demo"), RunInfo(name="demo", command="train"))
        >>> w.add_samples([Sample(t=0.0, source="host", metric="cpu_util_pct", value=50.0)])
        >>> w.close("completed")
    """

    def __init__(
        self,
        run_dir: Path,
        info: RunInfo,
        *,
        commit_every_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        db_name: str = DB_NAME,
        rollup_every_s: float = 5.0,
        keep_raw_steps: int = rollups.KEEP_RAW_STEPS,
        keep_raw_samples_s: float = rollups.KEEP_RAW_SAMPLES_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / db_name
        self._clock = clock
        self._commit_every_s = commit_every_s
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._closed = False
        self._rollup_every_s = rollup_every_s
        self._keep_raw_steps = keep_raw_steps
        self._keep_raw_samples_s = keep_raw_samples_s
        self._newest_sample_t = 0.0
        self._last_rollup = time.monotonic()
        # The newest step's roll-up slice, and the slice of the newest step at the last roll-up:
        # once a step of a later slice arrives there is a finished slice to fold.
        self._newest_slice = self._rolled_slice = -1
        self.error: str | None = None  # why recording stopped (a write failed), if it did
        # Steps reach the writer through a deque: ``append`` and ``popleft`` are atomic under
        # the interpreter lock, so the producer's side is one C call, no lock and no wake-up
        # (waking the writer once per step cost more than timing the step). The writer drains
        # it every STEP_DRAIN_S, so a fast loop queues at most ~0.1 s of rows and a live reader
        # is at most one commit behind.
        self._step_rows: deque[tuple[Any, ...]] = deque()
        self.add_step_row = self._step_rows.append
        self._recent_rows: deque[tuple[Any, ...]] = deque(maxlen=LATEST_STEPS)
        con = connect(self.path)
        try:
            with con:
                con.executescript(SCHEMA)
                if con.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                    con.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                rollups.prepare_writer(con)
                # Roll-up aggregates kept as steps go in (store/stepfold.py), from the rows a
                # resumed run left unrolled on.
                self._folder = stepfold.StepFolder()
                self._folder.resync(con)
                # A resumed run appends to the same database: phase ids continue after the last.
                last = con.execute("SELECT MAX(phase_id) FROM phases").fetchone()[0]
                self.next_phase_id = 0 if last is None else int(last) + 1
                info.started = info.started or clock()
                info.pid = info.pid or os.getpid()
                con.execute(
                    "INSERT OR REPLACE INTO runs VALUES (1,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (info.name, info.command, info.device, info.kind, info.status,
                     info.started, info.ended, info.started, info.pid, info.rank,
                     info.world_size, info.exit_code, json.dumps(info.config, default=str)),
                )
        finally:
            con.close()
        self.info = info
        self._thread = threading.Thread(target=self._run, name="stepscope-store", daemon=True)
        self._thread.start()

    # -- producers (any thread) -------------------------------------------------------------
    def add_step(self, rec: StepRecord) -> None:
        self.add_step_rows((_STEP_ROW(rec),))

    def add_step_rows(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Steps as rows in ``StepRecord`` field order (``add_step_row`` takes one, cheapest)."""
        self._step_rows.extend(rows)

    def _hand_over_steps(self) -> None:
        # A token in the queue, so the steps queued so far go in before the records queued after
        # them (a phase's end after its last step).
        self._queue.put(("steps", None))

    def add_samples(self, samples: Iterable[Sample]) -> None:
        self._queue.put(("samples", list(samples)))

    def add_arrival(self, rec: ArrivalRecord) -> None:
        self._queue.put(("arrival", rec))

    def put_phase(self, rec: PhaseRecord) -> None:
        """Insert or update a phase row (call at its start and again at its end)."""
        self._hand_over_steps()
        self._queue.put(("phase", PhaseRecord(**vars(rec))))

    def put_process(self, proc: ProcessInfo) -> None:
        self._queue.put(("process", proc))

    def note(self, source: str, text: str) -> None:
        self._queue.put(("note", Note(t=self._clock(), source=source, text=text)))

    def fact(self, key: str, value: Any, how_measured: str = "") -> None:
        self._queue.put(("fact", Fact(key=key, value=value, how_measured=how_measured)))

    def update_run(self, **fields: Any) -> None:
        """Update columns of the run row, e.g. ``device="cuda:0"`` or ``config={...}``."""
        self._queue.put(("run", fields))

    def flush(self, timeout_s: float = 10.0) -> None:
        """Block until everything queued so far is committed."""
        done = threading.Event()
        self._hand_over_steps()
        self._queue.put(("flush", done))
        done.wait(timeout_s)

    def close(self, status: str = "completed", exit_code: int | None = None, *,
              timeout_s: float = 30.0) -> None:
        """Mark the run ended with ``status`` and stop the writer thread (idempotent).

        Waits at most ``timeout_s`` for the writer to drain: a training process must not hang
        at exit on a slow disk (what is committed stays readable). A writer given more than it
        can drain in that time is still writing when this returns; callers that read the run
        straight after (benchmarks writing millions of rows) pass a longer wait.
        """
        if self._closed:
            return
        self._closed = True
        self._hand_over_steps()
        self._queue.put(("run", {"status": status, "ended": self._clock(), "exit_code": exit_code}))
        self._queue.put(("stop", None))
        self._thread.join(timeout=timeout_s)

    # -- the writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        con = connect(self.path)
        last_commit = time.monotonic()
        self._last_rollup = last_commit
        try:
            while True:
                timeout = min(STEP_DRAIN_S, max(
                    0.0, self._commit_every_s - (time.monotonic() - last_commit)))
                try:
                    kind, payload = self._queue.get(timeout=timeout)
                except queue.Empty:
                    kind, payload = "tick", None
                if kind == "flush":
                    if not self.error:
                        self._guarded(con, self._commit)
                    payload.set()
                    last_commit = time.monotonic()
                    continue
                if self.error:  # recording stopped: drain the queue so producers never block
                    self._step_rows.clear()
                    if kind == "stop":
                        return
                    continue
                if kind == "stop":
                    self._guarded(con, self._finish)
                    return
                if kind != "tick":
                    self._guarded(con, functools.partial(self._apply, kind=kind, p=payload))
                elif self._step_rows:
                    self._guarded(con, functools.partial(self._apply, kind="steps", p=None))
                if time.monotonic() - last_commit >= self._commit_every_s:
                    self._guarded(con, self._commit)
                    last_commit = time.monotonic()
        finally:
            con.close()

    def _guarded(self, con: sqlite3.Connection, work: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``work``; a failed write (full disk, I/O error) stops recording, not training.

        The transaction in flight is rolled back, so the database keeps every earlier commit and
        stays readable; ``self.error`` says why recording stopped (the trainer reports it).
        """
        try:
            work(con)
        except (sqlite3.Error, OSError) as exc:
            self.error = f"{exc} (writing {self.path})"
            with contextlib.suppress(sqlite3.Error):
                con.rollback()

    def latest_step_rows(self) -> list[tuple[Any, ...]]:
        """The newest LATEST_STEPS steps handed over, as rows (a progress line's figures).

        Rows leave the queue before they join the drained ones, so a row in transit is missed
        for a moment, never counted twice.
        """
        rows = [*self._recent_rows, *self._step_rows]
        return rows[-LATEST_STEPS:]

    def _take_step_rows(self) -> list[tuple[Any, ...]]:
        # Only this thread pops, so the length read first is a floor of what is there.
        pop = self._step_rows.popleft
        rows = [pop() for _ in range(len(self._step_rows))]
        self._recent_rows.extend(rows[-LATEST_STEPS:])
        return rows

    def _finish(self, con: sqlite3.Connection) -> None:
        self._roll_up(con, final=True)
        self._commit(con)
        with contextlib.suppress(sqlite3.Error):  # a reader may hold the WAL
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _roll_up(self, con: sqlite3.Connection, final: bool) -> None:
        """Fold old raw rows into roll-ups (see :mod:`stepscope.store.rollups`)."""
        self._last_rollup = time.monotonic()
        self._rolled_slice = self._newest_slice
        self._folder.roll_up(con, final=final, keep_raw=self._keep_raw_steps)
        if self._newest_sample_t:
            rollups.roll_up_samples(con, self._newest_sample_t, keep_raw_s=self._keep_raw_samples_s)

    def _commit(self, con: sqlite3.Connection) -> None:
        # Steps still in the producer's batch go in too: a slow loop's last step shows within
        # one commit period, not one step later.
        self._apply(con, "steps", None)
        # Every few seconds, and whenever a slice has finished since: steps written faster
        # than they happened (a replay, a bench) would otherwise fill whole slices between two
        # roll-ups, and raw rows are dropped only a whole pass at a time, so one long pass kept
        # every one of them past the raw window.
        if time.monotonic() - self._last_rollup >= self._rollup_every_s \
                or self._newest_slice > self._rolled_slice:
            self._roll_up(con, final=False)
        con.execute("UPDATE runs SET heartbeat=? WHERE id=1", (self._clock(),))
        con.commit()

    def _apply(self, con: sqlite3.Connection, kind: str, p: Any) -> None:
        if kind == "steps":
            rows = self._take_step_rows()
            if rows:
                self._folder.add(con, rows)
                self._newest_slice = max(self._newest_slice,
                                         int(rows[-1][_T_START] // rollups.STEP_INTERVAL_S))
        elif kind == "samples":
            if p:
                self._newest_sample_t = max(self._newest_sample_t, max(s.t for s in p))
            con.executemany(
                "INSERT INTO samples VALUES (?,?,?,?)",
                [(s.t, s.source, s.metric, float(s.value)) for s in p],
            )
        elif kind == "phase":
            con.execute(
                f"INSERT OR REPLACE INTO phases VALUES ({','.join('?' * len(PHASE_COLS))})",
                tuple(getattr(p, c) for c in PHASE_COLS),
            )
        elif kind == "process":
            pr: ProcessInfo = p
            con.execute(
                "INSERT INTO processes VALUES (?,?,?,?,?,?) ON CONFLICT(pid) DO UPDATE SET "
                "last_t=excluded.last_t, role=excluded.role, name=excluded.name",
                (pr.pid, pr.ppid, pr.role, pr.name, pr.first_t, pr.last_t),
            )
        elif kind == "arrival":
            a: ArrivalRecord = p
            con.execute("INSERT OR REPLACE INTO arrivals VALUES (?,?,?,?,?)",
                        (a.seq, a.t_arrive, a.wait_s, a.comm_s, a.buckets))
        elif kind == "note":
            con.execute("INSERT INTO notes VALUES (?,?,?)", (p.t, p.source, p.text))
        elif kind == "fact":
            con.execute(
                "INSERT OR REPLACE INTO facts VALUES (?,?,?)",
                (p.key, json.dumps(p.value, default=str), p.how_measured),
            )
        elif kind == "run":
            fields = dict(p)
            if "config" in fields:
                fields["config_json"] = json.dumps(fields.pop("config"), default=str)
            sets = ",".join(f"{k}=?" for k in fields)
            con.execute(f"UPDATE runs SET {sets} WHERE id=1", tuple(fields.values()))


def compact_run(run_dir: Path, *, keep_raw_steps: int = 0, db_name: str = DB_NAME) -> None:
    """Fold a finished run's raw steps into roll-ups, keeping only the newest ``keep_raw_steps``.

    What the writer does as a run goes on, done at once; the analysis reads the same figures.
    """
    con = connect(Path(run_dir) / db_name)
    try:
        with con:
            con.executescript(SCHEMA)
        with con:
            rollups.roll_up_steps(con, final=True, keep_raw=keep_raw_steps)
    finally:
        con.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunReader:
    """Read-only view of a run database; safe while the run is still being written.

    Examples:
        >>> r = RunReader(Path("runs/demo"))
        >>> r.run().status
        'completed'
        >>> t, v = r.series("cpu_util_pct", source="host")
    """

    def __init__(self, run_dir: Path, *, db_name: str = DB_NAME) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / db_name if self.run_dir.is_dir() else self.run_dir
        if not self.path.is_file():
            raise StoreError(
                f"no run database at {self.path}: expected a run directory made by "
                "`stepscope train` or `stepscope watch` (it holds run.db)"
            )
        try:
            self._con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0)
            version = self._con.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a readable stepscope run database: {exc}") from exc
        if not version or version[0] != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version and version[0]}, this stepscope "
                f"reads version {SCHEMA_VERSION}: use the stepscope version that recorded it"
            )
        self._agg = Aggregates(self._con)
        self._mark_if_interrupted()

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mark_if_interrupted(self) -> None:
        """A run still 'running' whose writer process is gone (or silent too long) was killed."""
        row = self._con.execute("SELECT status, pid, heartbeat FROM runs WHERE id=1").fetchone()
        if not row or row[0] != "running":
            return
        pid = row[1]
        # A writer commits at least every second; a silent database alone proves nothing (the
        # writer may be busy), but a writer process that no longer exists does.
        if not pid or _pid_alive(pid):
            return
        with contextlib.suppress(sqlite3.Error):
            rw = connect(self.path)
            with rw:
                rw.execute(
                    "UPDATE runs SET status='interrupted', ended=heartbeat "
                    "WHERE id=1 AND status='running'"
                )
            rw.close()

    # -- tables -----------------------------------------------------------------------------
    def run(self) -> RunInfo:
        row = self._con.execute(
            "SELECT name, command, device, kind, status, started, ended, heartbeat, pid, rank, "
            "world_size, exit_code, config_json FROM runs WHERE id=1"
        ).fetchone()
        if row is None:
            raise StoreError(f"{self.path} holds no run")
        (name, command, device, kind, status, started, ended, heartbeat, pid, rank, world,
         exit_code, config_json) = row
        if status == "running" and pid and not _pid_alive(pid):
            status, ended = "interrupted", heartbeat
        return RunInfo(
            name=name, command=command, device=device, kind=kind, status=status,
            started=started, ended=ended, pid=pid, rank=rank or 0, world_size=world or 1,
            exit_code=exit_code, config=json.loads(config_json or "{}"),
        )

    def heartbeat(self) -> float | None:
        row = self._con.execute("SELECT heartbeat FROM runs WHERE id=1").fetchone()
        return row[0] if row else None

    def phases(self) -> list[PhaseRecord]:
        rows = self._con.execute(
            f"SELECT {','.join(PHASE_COLS)} FROM phases ORDER BY started, phase_id"
        )
        return [PhaseRecord(**dict(zip(PHASE_COLS, r, strict=True))) for r in rows]

    def steps(self, phase_id: int | None = None) -> list[StepRecord]:
        sql = f"SELECT {','.join(STEP_COLS)} FROM steps"
        args: tuple[Any, ...] = ()
        if phase_id is not None:
            sql, args = sql + " WHERE phase_id=?", (phase_id,)
        out = []
        for r in self._con.execute(sql + " ORDER BY phase_id, step", args):
            d = dict(zip(STEP_COLS, r, strict=True))
            d["warmup"] = bool(d["warmup"])
            out.append(StepRecord(**d))
        return out

    def steps_after(self, rowid: int, limit: int = 10_000) -> list[tuple[int, StepRecord]]:
        """Steps stored after row ``rowid``, with their row ids, oldest first (for live
        readers that poll: pass the last row id seen)."""
        sql = (f"SELECT rowid, {','.join(STEP_COLS)} FROM steps WHERE rowid > ? "
               "ORDER BY rowid LIMIT ?")
        out = []
        for r in self._con.execute(sql, (rowid, limit)):
            d = dict(zip(STEP_COLS, r[1:], strict=True))
            d["warmup"] = bool(d["warmup"])
            out.append((int(r[0]), StepRecord(**d)))
        return out

    def recent_steps(self, phase_id: int, n: int) -> list[StepRecord]:
        """The last ``n`` raw steps of one phase, oldest first."""
        rows = self._con.execute(
            f"SELECT {','.join(STEP_COLS)} FROM steps WHERE phase_id=? ORDER BY rowid DESC "
            "LIMIT ?", (phase_id, n)).fetchall()
        out = []
        for r in reversed(rows):
            d = dict(zip(STEP_COLS, r, strict=True))
            d["warmup"] = bool(d["warmup"])
            out.append(StepRecord(**d))
        return out

    def iter_steps(self) -> Iterator[StepRecord]:
        for r in self._con.execute(f"SELECT {','.join(STEP_COLS)} FROM steps ORDER BY t_start"):
            d = dict(zip(STEP_COLS, r, strict=True))
            d["warmup"] = bool(d["warmup"])
            yield StepRecord(**d)

    def arrivals(self) -> list[ArrivalRecord]:
        """Gradient all-reduce arrivals in order (empty for stores made before the table)."""
        try:
            rows = self._con.execute(
                "SELECT seq, t_arrive, wait_s, comm_s, buckets FROM arrivals ORDER BY seq"
            ).fetchall()
        except sqlite3.OperationalError:  # no such table: an older store
            return []
        return [ArrivalRecord(*r) for r in rows]

    def arrival_sample(self, stride: int, last_seq: int) -> list[ArrivalRecord]:
        """Every ``stride``-th arrival up to ``last_seq`` (a bounded sample for big jobs)."""
        try:
            rows = self._con.execute(
                "SELECT seq, t_arrive, wait_s, comm_s, buckets FROM arrivals "
                "WHERE seq % ? = 0 AND seq <= ? ORDER BY seq", (max(1, stride), last_seq)
            ).fetchall()
        except sqlite3.OperationalError:
            return []
        return [ArrivalRecord(*r) for r in rows]

    def last_arrival_seq(self) -> int | None:
        try:
            row = self._con.execute("SELECT MAX(seq) FROM arrivals").fetchone()
        except sqlite3.OperationalError:
            return None
        return None if row is None or row[0] is None else int(row[0])

    def train_step_totals(self) -> dict[str, float]:
        """Sums over the steady (non-warm-up) training steps: ``steps`` and each ``*_s`` part,
        one aggregate query instead of every row (the per-rank roll-up of big jobs)."""
        row = self._con.execute(
            "SELECT COUNT(*), TOTAL(s.wall_s), TOTAL(s.data_wait_s), TOTAL(s.transfer_s), "
            "TOTAL(s.compute_s), TOTAL(s.comm_s), TOTAL(s.other_s), TOTAL(s.images) "
            "FROM steps s JOIN phases p ON s.phase_id = p.phase_id "
            "WHERE p.phase = 'train' AND s.warmup = 0"
        ).fetchone()
        keys = ("steps", "wall_s", "data_wait_s", "transfer_s", "compute_s", "comm_s",
                "other_s", "images")
        return dict(zip(keys, (float(v or 0.0) for v in row), strict=True))

    def processes(self) -> list[ProcessInfo]:
        rows = self._con.execute(
            "SELECT pid, ppid, role, name, first_t, last_t FROM processes ORDER BY first_t"
        )
        return [ProcessInfo(*r) for r in rows]

    def notes(self) -> list[Note]:
        return [Note(*r) for r in self._con.execute("SELECT t, source, text FROM notes ORDER BY t")]

    def facts(self) -> dict[str, Fact]:
        rows = self._con.execute("SELECT key, value_json, how_measured FROM facts")
        return {k: Fact(key=k, value=json.loads(v), how_measured=h or "") for k, v, h in rows}

    # -- samples ----------------------------------------------------------------------------
    def metrics(self) -> list[tuple[str, str]]:
        """Every (source, metric) pair recorded."""
        rows = self._con.execute(
            f"SELECT DISTINCT source, metric FROM ({self._agg.samples_sql}) ORDER BY 1, 2")
        return [(s, m) for s, m in rows]

    def series(
        self,
        metric: str,
        source: str | None = None,
        t0: float | None = None,
        t1: float | None = None,
        stat: Stat = "mean",
    ) -> tuple[list[float], list[float]]:
        """Times and values of one metric (one source, or all sources interleaved); a
        rolled-up slice reads as its ``stat``: mean, or highest or lowest sample."""
        return self._agg.series(metric, source, t0, t1, stat)

    def series_rows(self, metric: str, source: str | None = None, stat: Stat = "mean"
                    ) -> SeriesRows:
        """:meth:`series` with each point's sample count and slice (a roll-up's minute)."""
        return self._agg.series_rows(metric, source, None, None, stat)

    def sources(self, metric: str) -> list[str]:
        rows = self._con.execute(
            f"SELECT DISTINCT source FROM ({self._agg.samples_sql}) WHERE metric=?", (metric,))
        return sorted(r[0] for r in rows)

    @property
    def aggregates(self) -> Aggregates:
        """Bucketed and per-phase aggregates over raw rows and roll-ups together."""
        return self._agg

    def latest(self, since_t: float) -> dict[tuple[str, str], float]:
        """The newest value of every (source, metric) sampled at or after ``since_t``."""
        rows = self._con.execute(
            "SELECT s.source, s.metric, s.value FROM samples s JOIN (SELECT source, metric, "
            "MAX(t) AS t FROM samples WHERE t >= ? GROUP BY source, metric) m "
            "ON s.source = m.source AND s.metric = m.metric AND s.t = m.t",
            (since_t,),
        )
        return {(src, metric): float(v) for src, metric, v in rows}

    def sample_count(self) -> int:
        return self._agg.sample_count()

    def time_range(self) -> tuple[float, float] | None:
        return self._agg.time_range()
