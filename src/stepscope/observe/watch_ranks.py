"""The ranks of a watched distributed job, each recorded into its own store by the watch parent.

``stepscope watch -- torchrun --nproc-per-node 2 train.py``: the command's first Python process
is the launcher; the training processes are its children. Each of them loads the watch hooks
(PYTHONPATH), holds its records, and once it joins a torch.distributed process group connects to
the socket this module listens on and says which rank it is (``W``: rank, world, local rank,
host, pid). From then on its lines go to its own store: ``run.rank<k>.db`` for rank k, and
rank 0 into ``run.db`` (as ``stepscope train`` keeps it, so every single-run tool reads the
primary rank). One connection, one reader thread, one :class:`RecordSink`: the parent stays the
only writer of every store. A Lightning script is rank 0 itself and launches the others: its
claim arrives on the pipe instead (:meth:`RankHub.claim_primary`).

Each rank store gets its own process-tree sampler rooted at that rank's process (its CPU, memory,
I/O and its DataLoader workers); host-wide series stay in ``run.db``, sampled once.

How a rank ended: a rank that exits in order (normal end, ``sys.exit``, an uncaught exception)
sends ``B`` from its ``atexit`` handler; one killed by a signal never does. Its exit status is
read from ``/proc/PID/stat`` (field 52, ``exit_code``) while it is a zombie, before its
launcher reaps it: torchrun polls its workers every 0.1 s, so a watcher thread looks every
``PROBE_EVERY_S``. The first rank to end abnormally is the job's failed rank; ranks that end
abnormally after it were taken down with the job (``interrupted``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.observe.proctree import ProcessTree
from stepscope.observe.sampling import SamplerThread, SamplerUnavailable
from stepscope.store.db import RunWriter
from stepscope.store.records import RunInfo
from stepscope.store.rundir import rank_db_name

SOCK_NAME = "ranks.sock"
PROBE_EVERY_S = 0.01
RANK_END_TIMEOUT_S = 60.0  # how long ranks that joined the job may outlive the command
SinkFactory = Callable[[RunWriter, Any, bool], Any]


@dataclass
class RankEnd:
    """How one rank's process ended, as far as the parent could see."""

    t: float | None = None
    exit_code: int | None = None  # shell convention: 128 + N when killed by signal N
    orderly: bool = False  # it said goodbye (atexit ran)


@dataclass
class Rank:
    """One training rank seen by the parent."""

    rank: int
    world_size: int
    local_rank: int | None
    host: str
    pid: int
    backend: str
    writer: RunWriter
    sink: Any
    sampler: SamplerThread | None = None
    owns_sink: bool = True  # False for the command's own process: watch finishes its sink
    node_rank: int | None = None
    end: RankEnd = field(default_factory=RankEnd)
    done: threading.Event = field(default_factory=threading.Event)


def parse_exit_code(stat_text: str) -> int | None:
    """Exit status of a zombie from /proc/PID/stat (``waitpid`` form) in shell convention;
    None while the process still runs."""
    f = stat_text.rpartition(")")[2].split()
    if not f or f[0] != "Z" or len(f) < 50:
        return None
    status = int(f[49])
    signum = status & 0x7F
    return 128 + signum if signum else (status >> 8) & 0xFF


class RankHub:
    """Accepts the ranks' connections and records each rank into its store.

    Args:
        run_dir: the run directory.
        primary: the writer of ``run.db`` (rank 0 writes there).
        make_sink: ``make_sink(writer, tree, primary)`` builds a :class:`RecordSink`.
        info: the watch's run row (name, command); rank stores copy it.
        interval_s: sampling period of each rank's process-tree sampler.
    """

    def __init__(self, run_dir: Path, primary: RunWriter, make_sink: SinkFactory,
                 info: RunInfo, interval_s: float) -> None:
        self.run_dir = Path(run_dir)
        self._primary = primary
        self._make_sink = make_sink
        self._info = info
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self.ranks: dict[int, Rank] = {}
        self._exits: dict[int, int] = {}  # pid -> exit status, from the reaper
        self.notes: list[str] = []
        # A socket path is limited to ~108 bytes: a short private directory, not the run dir.
        self._dir = tempfile.mkdtemp(prefix="stepscope-watch-")
        self.path = os.path.join(self._dir, SOCK_NAME)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(1024)
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._wake = threading.Event()  # a rank joined, or the hub is closing
        self._accepter = threading.Thread(target=self._accept, name="stepscope-ranks",
                                          daemon=True)
        self._prober = threading.Thread(target=self._probe, name="stepscope-rank-exits",
                                        daemon=True)

    def start(self) -> None:
        self._accepter.start()
        self._prober.start()

    # -- connections ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name="stepscope-rank")
            t.start()
            with self._lock:
                self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            try:
                first = json.loads(stream.readline())
            except ValueError:
                return
            if not (isinstance(first, list) and first and first[0] == "W"):
                return
            rank = self._open(first)
            if rank is None:
                return
            for line in stream:
                if line.startswith(b'["Q"'):  # commit, then answer (multi-node store copy)
                    rank.writer.flush()
                    with contextlib.suppress(OSError):
                        conn.sendall(b"ok\n")
                elif line.strip():
                    rank.end.orderly |= line.startswith(b'["B"')
                    rank.sink.handle_line(line)
            if rank.end.t is None:
                rank.end.t = time.time()

    def _open(self, msg: list[Any]) -> Rank | None:
        """Create the store, sink and sampler of a newly claimed rank."""
        _, k, world, local, host, pid, backend, *node = msg
        with self._lock:
            if int(k) in self.ranks:
                self.notes.append(f"two processes claimed rank {k}: pid {pid} ignored")
                return None
            writer = self._primary if int(k) == 0 else RunWriter(
                self.run_dir, RunInfo(name=self._info.name, command=self._info.command,
                                      kind="watch", rank=int(k), world_size=int(world),
                                      pid=int(pid), config=dict(self._info.config)),
                db_name=rank_db_name(int(k)))
            tree = _tree(int(pid))
            sampler = None
            if tree is not None and int(k) != 0:
                # run.db already samples the whole command's tree (rank 0's process in it).
                sampler = SamplerThread([tree], writer, interval_s=self._interval_s)
                sampler.start()
            rank = Rank(rank=int(k), world_size=int(world), local_rank=local, host=str(host),
                        pid=int(pid), backend=str(backend), writer=writer,
                        sink=self._make_sink(writer, tree, int(k) == 0), sampler=sampler,
                        node_rank=node[0] if node else None)
            self.ranks[rank.rank] = rank
        self._wake.set()
        self._identity_facts(rank)
        return rank

    def claim_primary(self, msg: list[Any], sink: Any) -> None:
        """The command's first process joined a process group (Lightning's rank 0)."""
        _, k, world, local, host, pid, backend, *node = msg
        with self._lock:
            if int(k) in self.ranks:
                return
            rank = Rank(rank=int(k), world_size=int(world), local_rank=local, host=str(host),
                        pid=int(pid), backend=str(backend), writer=self._primary, sink=sink,
                        owns_sink=False, node_rank=node[0] if node else None)
            self.ranks[rank.rank] = rank
        self._wake.set()
        if rank.rank != 0:
            self.notes.append(f"the command's own process is rank {rank.rank}: its records are "
                              "in run.db")
        self._identity_facts(rank)

    def _identity_facts(self, r: Rank) -> None:
        w = r.writer
        how = "torch.distributed, read when the process joined its process group"
        w.fact("dist.rank", r.rank, f"get_rank(): {how}")
        w.fact("dist.world_size", r.world_size, f"get_world_size(): {how}")
        w.fact("dist.local_rank", r.local_rank, "LOCAL_RANK in the rank's environment")
        w.fact("dist.host", r.host, "socket.gethostname() in the rank's process")
        w.fact("dist.pid", r.pid, "the rank's process id")
        w.fact("dist.backend", r.backend, f"get_backend(): {how}")
        w.fact("dist.node_rank", r.node_rank,
               "GROUP_RANK (torchrun) or NODE_RANK (Lightning) in the rank's environment")
        if r.rank == 0:
            w.update_run(rank=0, world_size=r.world_size)

    # -- exits ---------------------------------------------------------------------------------
    def _probe(self) -> None:
        """Catch each rank's exit status while it is a zombie (see module doc)."""
        while not self._closing:
            with self._lock:
                pending = [r for r in self.ranks.values() if r.end.exit_code is None
                           and not r.done.is_set()]
            if not pending:
                # Nothing to look for until a rank joins: polling nothing at 100 Hz cost the
                # watching parent ~10 ms of CPU a second (~100 us a wake-up on this machine),
                # the largest part of what watching a single-process run cost.
                self._wake.wait()
                self._wake.clear()
                continue
            for r in pending:
                try:
                    with open(f"/proc/{r.pid}/stat") as f:
                        code = parse_exit_code(f.read())
                except OSError:  # reaped before we looked: status unknown
                    r.done.set()
                    if r.end.t is None:
                        r.end.t = time.time()
                    continue
                if code is not None:
                    r.end.exit_code = code
                    r.end.t = r.end.t or time.time()
                    r.done.set()
            time.sleep(PROBE_EVERY_S)

    def set_exit(self, pid: int, exit_code: int) -> None:
        """Process ``pid`` ended with ``exit_code`` (shell convention), as told by whoever reaped
        it: us for the command's own process, its launcher (``X`` messages) for a rank."""
        with self._lock:
            self._exits[pid] = exit_code
            for r in self.ranks.values():
                if r.pid == pid:
                    r.end.exit_code = exit_code
                    r.end.orderly = r.end.orderly or exit_code < 128
                    r.end.t = r.end.t or time.time()
                    r.done.set()

    def wait_ranks(self, timeout_s: float = RANK_END_TIMEOUT_S) -> list[str]:
        """Wait up to ``timeout_s`` for every rank's process to end; notes any still running.

        A launcher may exit before the ranks it started: Lightning's rank 0 does not wait for
        the ranks it spawned, which can still be tearing down their process group seconds later
        on a loaded machine. Ending them when the command exits would turn a finished job into
        a failed one (exit 143)."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while True:
            with self._lock:
                running = [r for r in self.ranks.values()
                           if r.end.exit_code is None and not r.done.is_set()]
            left = deadline - time.monotonic()
            if not running:
                return []
            if left <= 0:
                return [f"rank(s) {', '.join(str(r.rank) for r in running)} still ran "
                        f"{timeout_s:.0f} s after the command exited: watch ended them"]
            running[0].done.wait(min(left, 0.1))

    def finish(self, t_end: float, drain_s: float) -> tuple[int | None, list[str]]:
        """Stop listening, drain the ranks, close their stores with their status.

        Returns the exit code of the failed rank (None if none failed) and notes for run.db.
        """
        self._closing = True
        self._wake.set()
        with contextlib.suppress(OSError):
            # close() alone does not wake a thread blocked in accept() on Linux (it stays
            # blocked on the listening socket, and its thread outlives the watch); shutdown()
            # makes accept() return with an error at once.
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        deadline = time.monotonic() + drain_s
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        for thread in (self._accepter, self._prober):
            if thread.ident is not None:
                thread.join(1.0)
        shutil.rmtree(self._dir, ignore_errors=True)
        for r in self.ranks.values():  # a status reported before its rank was known
            if r.pid in self._exits:
                r.end.exit_code = self._exits[r.pid]
        failed = first_failure(list(self.ranks.values()))
        notes = list(self.notes)
        for r in sorted(self.ranks.values(), key=lambda r: r.rank):
            status = rank_status(r, failed)
            if r.sampler is not None:
                r.sampler.stop()
            if r.owns_sink:
                notes_k = r.sink.finish(t_end)
                if r.writer is self._primary:
                    notes += notes_k
                else:
                    for text in notes_k:
                        r.writer.note("watch", text)
            self._status_facts(r, status)
            if r.writer is not self._primary:
                r.writer.close(status, r.end.exit_code)
        if failed is not None:
            notes.append(failure_note(failed))
        if self.ranks:
            self._primary.fact("watch.ranks", sorted(self.ranks),
                               "ranks whose processes joined a process group under the watch")
            self._primary.fact("watch.rank_pids", {str(r.rank): r.pid
                                                   for r in self.ranks.values()},
                               "each rank's process id")
        return (None if failed is None else failed.end.exit_code), notes

    def _status_facts(self, r: Rank, status: str) -> None:
        how = ("how the rank's process ended: an orderly exit says goodbye from atexit; the "
               "exit status is read from /proc/PID/stat while it is a zombie")
        r.writer.fact("dist.status", status, how)
        r.writer.fact("dist.exit_code", r.end.exit_code, how)
        r.writer.fact("dist.ended", r.end.t, "when the parent saw the rank's process end")


def _tree(pid: int) -> ProcessTree | None:
    try:
        return ProcessTree(pid)
    except SamplerUnavailable:
        return None


def _abnormal(r: Rank) -> bool:
    code = r.end.exit_code
    return (code is not None and code != 0) or (code is None and not r.end.orderly)


def first_failure(ranks: list[Rank]) -> Rank | None:
    """The rank that ended abnormally first (the others were taken down with the job)."""
    bad = [r for r in ranks if _abnormal(r)]
    return min(bad, key=lambda r: (r.end.t or float("inf"), r.rank)) if bad else None


def rank_status(r: Rank, failed: Rank | None) -> str:
    if not _abnormal(r):
        return "completed"
    return "failed" if r is failed else "interrupted"


def failure_note(r: Rank) -> str:
    code = r.end.exit_code
    how = ("exit status unknown (reaped before it was read)" if code is None
           else f"killed by signal {code - 128} (exit code {code})" if code > 128
           else f"exit code {code}")
    return (f"rank {r.rank} (pid {r.pid} on {r.host}) failed first: {how}; the other ranks' "
            "records are kept")
