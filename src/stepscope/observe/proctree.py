"""The observed process tree: the root process and every live descendant, found again by PID at
each sample as DataLoader workers come and go.

Why tree I/O totals neither double count nor lose reaped workers:
``/proc/PID/io`` of a process reports its own threads plus every *reaped* descendant: when a
parent reaps a child (``wait``), the kernel adds the child's counters, including what the child
had inherited from its own reaped children, into the parent's (``kernel/exit.c``,
``wait_task_zombie``). So at any instant each byte read by the tree sits in exactly one live
counter: the reader's own while it lives (zombies included, until reaped), then its reaper's.
Summing the root's counter and every *live* descendant's own counter therefore counts each byte
once, and a worker that exits does not take its reads with it. We read ancestors before
descendants so that a reap racing the scan can only hide a child's bytes until the next sample
(never count them twice), and we keep the totals monotonic, which also holds the line when a
descendant leaves the tree without being reaped inside it (a daemon re-parented to init).

``rchar`` counts every ``read()``: page-cache hits and physical reads, but also pipes and sockets
(e.g. the small pickles DataLoader workers send the main process; the tensors travel through
shared memory, which ``rchar`` does not see). ``rchar - read_bytes`` is "reads served without
the disk" with that caveat.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepscope.observe.base import SamplerUnavailable
from stepscope.store.records import ProcessInfo, Sample

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# torch's DataLoader worker loop renames its process's main thread to this (prctl PR_SET_NAME),
# so /proc/PID/comm says it for fork- and spawn-started workers alike.
TORCH_WORKER_COMM = "pt_data_worker"


@dataclass
class ProcStat:
    """The fields of /proc/PID/stat we use."""

    pid: int
    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime
    threads: int
    start_ticks: int  # since boot; with pid it identifies a process across PID reuse
    rss_bytes: int


def parse_stat(pid: int, text: str) -> ProcStat:
    """Parse /proc/PID/stat; ``comm`` sits in parentheses and may itself contain ') '."""
    head, _, tail = text.rpartition(")")
    comm = head.partition("(")[2]
    f = tail.split()
    return ProcStat(
        pid=pid, comm=comm, state=f[0], ppid=int(f[1]), cpu_ticks=int(f[11]) + int(f[12]),
        threads=int(f[17]), start_ticks=int(f[19]), rss_bytes=int(f[21]) * PAGE_BYTES,
    )


def parse_io(text: str) -> tuple[int, int]:
    """``(read_bytes, rchar)`` from /proc/PID/io."""
    values = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return int(values.get("read_bytes", 0)), int(values.get("rchar", 0))


def parse_uss(smaps_rollup: str) -> int:
    """Unique set size in bytes (Private_Clean + Private_Dirty) from /proc/PID/smaps_rollup."""
    total_kb = 0
    for line in smaps_rollup.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total_kb += int(line.split()[1])
    return total_kb * 1024


def _read(path: str) -> str | None:
    # Plain open() on a str: the scan reads every /proc/N/stat each sample, and pathlib's
    # per-call overhead would triple its cost.
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except (OSError, ValueError):  # gone between listing and reading, or not ours to read
        return None


def _display_name(comm: str, cmdline: str | None) -> str:
    """``comm``, except that interpreters get their script or module: ``python train.py``."""
    if not cmdline or not comm.startswith("python"):
        return comm
    args = [a for a in cmdline.split("\0") if a][1:]
    for i, arg in enumerate(args):
        if arg in ("-m", "-c") and i + 1 < len(args):
            return f"{comm} {arg} {args[i + 1][:40]}"
        if not arg.startswith("-"):
            return f"{comm} {os.path.basename(arg)}"
    return comm


@dataclass
class _Tracked:
    info: ProcessInfo
    start_ticks: int
    cpu_ticks: int
    cpu_t: float | None  # when cpu_ticks was read (or its birth); None until known
    read_bytes: int = 0
    rchar: int = 0
    rss_bytes: int = 0
    uss_bytes: int | None = None
    uss_t: float = float("-inf")
    dirty: bool = True  # info changed since new_processes() last returned it


class ProcessTree:
    """Sampler of ``proc:<pid>`` and ``tree`` series (docs/records.md), and the source of the
    tree's I/O counters for phase boundaries.

    Args:
        root_pid: the process whose tree is observed.
        clock: stamps ``first_t``/``last_t`` of processes found outside ``sample``.
        include_root: False leaves the root itself out (an observer watching its own children);
            the reads of children it reaps are then kept from their last sample.
        uss_interval_s: USS is read from ``smaps_rollup``, which walks every page table entry
            (3-5 ms for a 700 MB torch process), so each process's USS is refreshed this often,
            and at most one process's per sample, which spreads the cost evenly. The tree's
            ``uss_bytes`` is the sum of each process's latest reading.
        discovery: how descendants are found: "children" (the kernel's per-thread children
            lists, cheap), "scan" (every /proc/N/stat), or "auto" (children where it exists).
        proc: the /proc mount.

    Examples:
        >>> tree = ProcessTree(os.getpid())
        >>> samples = tree.sample(time.time()); read_bytes, rchar = tree.io_totals()
    """

    name = "tree"

    def __init__(
        self,
        root_pid: int,
        *,
        clock: Callable[[], float] = time.time,
        include_root: bool = True,
        uss_interval_s: float = 10.0,
        discovery: str = "auto",
        proc: Path = PROC,
        uptime: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME),
    ) -> None:
        self.root_pid = root_pid
        self._uptime = uptime
        self.include_root = include_root
        self.uss_interval_s = uss_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tracked: dict[int, _Tracked] = {}
        self._departed = (0, 0)  # reads of departed processes, used only without the root
        self._totals = (0, 0)  # monotonic (read_bytes, rchar) of the tree
        self._last_t: float | None = None
        self._sampled_totals = (0, 0)
        self._procdir = str(proc)
        if _read(f"{proc}/{root_pid}/stat") is None:
            raise SamplerUnavailable(f"process {root_pid} not found in {proc}")
        has_children_files = os.path.exists(f"{proc}/{root_pid}/task/{root_pid}/children")
        self._by_children = discovery == "children" or (discovery == "auto" and has_children_files)
        with self._lock:
            self._refresh(clock())
            self._sampled_totals = self._totals

    # -- scanning ------------------------------------------------------------------------------
    def _scan(self) -> list[ProcStat]:
        """Stat of the root and its live descendants, ancestors before descendants."""
        order = self._scan_children() if self._by_children else self._scan_all()
        return order if self.include_root else order[1:]

    def _scan_children(self) -> list[ProcStat]:
        """Walk down from the root through /proc/PID/task/TID/children: cost grows with the
        tree, not with the host's process count (a GPU server may run hundreds)."""
        order: list[ProcStat] = []
        queue = [self.root_pid]
        while queue:  # breadth first: a parent is always read before its children
            pid = queue.pop(0)
            text = _read(f"{self._procdir}/{pid}/stat")
            if text is None:
                continue  # exited and reaped since its parent listed it
            order.append(parse_stat(pid, text))
            queue += self._children_of(pid)
        return order

    def _children_of(self, pid: int) -> list[int]:
        # A child belongs to the thread that forked it, so every thread's list is read. The
        # kernel builds each list in one read() for small lists; a child missed while the list
        # changes under us is found at the next sample.
        try:
            tids = os.listdir(f"{self._procdir}/{pid}/task")
        except OSError:
            return []
        kids: set[int] = set()
        for tid in tids:
            text = _read(f"{self._procdir}/{pid}/task/{tid}/children")
            if text:
                kids.update(int(k) for k in text.split())
        return sorted(kids)

    def _scan_all(self) -> list[ProcStat]:
        """Read every /proc/N/stat and link children to parents (kernels without the
        ``children`` files, CONFIG_PROC_CHILDREN=n)."""
        stats: dict[int, ProcStat] = {}
        children: dict[int, list[int]] = {}
        for name in os.listdir(self._procdir):
            if name.isdigit():
                text = _read(f"{self._procdir}/{name}/stat")
                if text is not None:
                    st = parse_stat(int(name), text)
                    stats[st.pid] = st
                    children.setdefault(st.ppid, []).append(st.pid)
        if self.root_pid not in stats:
            return []
        order, queue = [], [self.root_pid]
        while queue:
            pid = queue.pop(0)
            order.append(stats[pid])
            queue += sorted(children.get(pid, []))
        return order

    def _refresh(self, now: float) -> list[ProcStat]:
        """Rescan, update tracked processes and I/O counters, return the live stats."""
        live = self._scan()
        seen = {st.pid for st in live}
        for pid in [p for p in self._tracked if p not in seen]:
            gone = self._tracked.pop(pid)
            if not self.include_root:
                self._departed = (self._departed[0] + gone.read_bytes,
                                  self._departed[1] + gone.rchar)
        for st in live:
            self._track(st, now)
        reads = sum(t.read_bytes for t in self._tracked.values()) + self._departed[0]
        rchar = sum(t.rchar for t in self._tracked.values()) + self._departed[1]
        self._totals = (max(self._totals[0], reads), max(self._totals[1], rchar))
        return live

    def _track(self, st: ProcStat, now: float) -> None:
        t = self._tracked.get(st.pid)
        if t is None or t.start_ticks != st.start_ticks:  # new, or a reused PID
            cmdline = _read(f"{self._procdir}/{st.pid}/cmdline")
            info = ProcessInfo(st.pid, st.ppid, self._role(st, cmdline),
                               _display_name(st.comm, cmdline), now, now)
            t = _Tracked(info, st.start_ticks, st.cpu_ticks, None)
            self._since_birth(t, st, now)
            self._tracked[st.pid] = t
        elif t.info.role == "child" and st.comm == TORCH_WORKER_COMM:
            t.info.role = "worker"  # spawn-started workers rename themselves after start-up
            t.info.name = st.comm
        t.info.last_t = now
        t.rss_bytes = st.rss_bytes
        t.dirty = True
        io = _read(f"{self._procdir}/{st.pid}/io")
        if io is not None:
            t.read_bytes, t.rchar = parse_io(io)

    def _since_birth(self, t: _Tracked, st: ProcStat, now: float) -> None:
        """A process born since the last sample used every CPU tick it has in that interval:
        count them from its start (``/proc`` stamps it in ticks since boot), not from when the
        scan first saw it. Otherwise a process's first interval is lost: a PyDataset's or a
        non-persistent DataLoader's workers start again each epoch, and on phases of a few
        samples their CPU, and the job's, read 15-20 points low (2 workers at 77 % and 78 % of a
        core beside a main process at 38 % read as a job at 77 % of two cores, not 96 %)."""
        if self._last_t is None:
            return
        # the start is stamped in whole ticks, rounded down: a birth just after the last
        # sample can read up to a tick before it
        age = self._uptime() - st.start_ticks / CLK_TCK
        if 0.0 <= age < now - self._last_t + 1.0 / CLK_TCK:
            t.cpu_ticks, t.cpu_t = 0, max(now - age, self._last_t)

    def _role(self, st: ProcStat, cmdline: str | None) -> str:
        if st.pid == self.root_pid:
            return "main"
        if st.comm == TORCH_WORKER_COMM:
            return "worker"
        if st.ppid != self.root_pid or not cmdline:
            return "child"
        # Fallback before torch renames the worker: a multiprocessing spawn child of main, or a
        # fork of main that did not exec (it still carries main's command line).
        if "spawn_main" in cmdline:
            return "worker"
        return "worker" if cmdline == _read(f"{self._procdir}/{self.root_pid}/cmdline") else "child"

    # -- the sampler -------------------------------------------------------------------------
    def sample(self, now: float) -> list[Sample]:
        """Rescan the tree; return per-process and tree samples stamped ``now``."""
        with self._lock:
            # the totals at the previous *sample*: io_totals() may have refreshed in between
            prev_totals, prev_t = self._sampled_totals, self._last_t
            live = self._refresh(now)
            uss_pid = self._next_uss_pid(now)
            out: list[Sample] = []
            tree_cpu = 0.0
            for st in live:
                proc_samples, cpu_pct = self._proc_samples(st, now, st.pid == uss_pid)
                out += proc_samples
                tree_cpu += cpu_pct
            with_uss = uss_pid is not None and all(
                t.uss_bytes is not None for t in self._tracked.values())
            out += self._tree_samples(now, tree_cpu, with_uss, prev_totals, prev_t)
            self._last_t, self._sampled_totals = now, self._totals
            return out

    def _next_uss_pid(self, now: float) -> int | None:
        """The process whose USS is oldest, if it is due (never read, or older than the
        interval)."""
        due = [t for t in self._tracked.values() if now - t.uss_t >= self.uss_interval_s]
        return min(due, key=lambda t: t.uss_t).info.pid if due else None

    def _proc_samples(self, st: ProcStat, now: float, read_uss: bool) -> tuple[list[Sample], float]:
        t = self._tracked[st.pid]
        src = f"proc:{st.pid}"
        cpu_pct = 0.0
        out = [
            Sample(now, src, "rss_bytes", float(st.rss_bytes)),
            Sample(now, src, "read_bytes", float(t.read_bytes)),
            Sample(now, src, "rchar_bytes", float(t.rchar)),
            Sample(now, src, "disk_wait", 1.0 if st.state == "D" else 0.0),
            Sample(now, src, "running", 1.0 if st.state == "R" else 0.0),
            Sample(now, src, "threads", float(st.threads)),
        ]
        if t.cpu_t is not None and now > t.cpu_t:
            cpu_pct = 100.0 * (st.cpu_ticks - t.cpu_ticks) / CLK_TCK / (now - t.cpu_t)
            out.append(Sample(now, src, "cpu_util_pct", max(0.0, cpu_pct)))
        t.cpu_ticks, t.cpu_t = st.cpu_ticks, now
        if read_uss:
            t.uss_t = now
            rollup = _read(f"{self._procdir}/{st.pid}/smaps_rollup")
            if rollup is not None:
                t.uss_bytes = parse_uss(rollup)
                out.append(Sample(now, src, "uss_bytes", float(t.uss_bytes)))
        return out, max(0.0, cpu_pct)

    def _tree_samples(
        self, now: float, cpu_pct: float, with_uss: bool,
        prev_totals: tuple[int, int], prev_t: float | None,
    ) -> list[Sample]:
        procs = self._tracked.values()
        reads, rchar = self._totals
        out = [
            Sample(now, "tree", "cpu_util_pct", cpu_pct),
            Sample(now, "tree", "rss_bytes", float(sum(t.rss_bytes for t in procs))),
            Sample(now, "tree", "read_bytes", float(reads)),
            Sample(now, "tree", "rchar_bytes", float(rchar)),
            Sample(now, "tree", "workers", float(sum(t.info.role == "worker" for t in procs))),
        ]
        if with_uss:
            out.append(Sample(now, "tree", "uss_bytes",
                              float(sum(t.uss_bytes or 0 for t in procs))))
        if prev_t is not None and now > prev_t:
            dt = now - prev_t
            d_read = reads - prev_totals[0]
            d_cache = max(0, (rchar - reads) - (prev_totals[1] - prev_totals[0]))
            out.append(Sample(now, "tree", "read_rate_bytes_per_s", d_read / dt))
            out.append(Sample(now, "tree", "cache_read_rate_bytes_per_s", d_cache / dt))
        return out

    # -- queries from other threads --------------------------------------------------------------
    def new_processes(self) -> list[ProcessInfo]:
        """Processes first seen, or seen again (``last_t`` moved), since the last call."""
        with self._lock:
            out = [ProcessInfo(**vars(t.info)) for t in self._tracked.values() if t.dirty]
            for t in self._tracked.values():
                t.dirty = False
            return out

    def io_totals(self) -> tuple[int, int]:
        """``(read_bytes, rchar)`` of the whole tree now, including reaped descendants.

        Rescans /proc (about a millisecond with a hundred processes), so a phase boundary gets
        an exact reading instead of the last sample's.
        """
        with self._lock:
            self._refresh(self._clock())
            return self._totals

    def pids(self) -> set[int]:
        """PIDs of the live tree at the last scan."""
        with self._lock:
            return set(self._tracked)

    def processes(self) -> list[ProcessInfo]:
        """The live tree at the last scan (copies)."""
        with self._lock:
            return [ProcessInfo(**vars(t.info)) for t in self._tracked.values()]
