"""torch.distributed hooks for ``stepscope watch``: which rank this process is, and when it
arrives at every gradient all-reduce. Installed with the PyTorch hooks, in every Python process
of the watched command.

Rank identity is what the process group says, read right after ``init_process_group`` returns
(``get_rank``/``get_world_size``): torchrun's and ``accelerate launch``'s workers, Lightning's
launched DDP processes and mpirun-style jobs all end up there, whatever their environment calls
the rank. A launcher never joins a process group, so it is never taken for a rank. Joining is
the *claim*: a process started below the command's first one only then connects to the watch
parent's socket (its lines waited until now; see ``Channel``), and the first process says so on
its pipe.

Arrival at the all-reduce: DDP reduces gradients bucket by bucket inside ``backward()``. At the
first forward of each ``DistributedDataParallel`` model (unless the script registered a comm
hook of its own, which DDP allows only once) we register a hook that all-reduces exactly like
DDP's default one (the bucket divided by the group size, then summed) and timestamps it: the
moment DDP hands a bucket over is the moment this rank's gradients for it were ready, the
moment its future completes is when every rank had arrived and the reduction was done. At the
step's last bucket (``GradBucket.is_last``) one ``A`` message carries the hand-over time, the
wait until completion, and the step's communication time (union of its buckets' intervals).
On gloo (CPU) the future completes when the reduction has; on NCCL it completes when the work
is enqueued, so there these are CPU-side times (what the GPU did is not measured here).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder

SOCK_VAR = "STEPSCOPE_WATCH_SOCK"
DIR_VAR = "STEPSCOPE_WATCH_DIR"
FLUSH_TIMEOUT_S = 10.0


def install(torch: ModuleType, rec: Recorder) -> None:
    """Patch ``torch.distributed`` and DDP in place so that ``rec`` learns ranks and arrivals."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return
    _patch_init(dist, rec)
    _patch_destroy(dist, rec)
    _patch_ddp(torch, dist, rec)
    if dist.is_initialized():
        claim(dist, rec)


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


def identity(dist: Any) -> list[Any]:
    """The ``W`` message: rank, world size, local rank, host, pid, backend, node rank."""
    return ["W", int(dist.get_rank()), int(dist.get_world_size()), _env_int("LOCAL_RANK"),
            socket.gethostname(), os.getpid(), str(dist.get_backend()),
            _env_int("GROUP_RANK", "NODE_RANK")]  # torchrun's, Lightning's node index


def claim(dist: Any, rec: Recorder) -> None:
    """Tell the parent which rank this process is (once); connect first if not yet talking."""
    if not rec.owner() or not rec.once("claim"):
        return
    ident = identity(dist)
    if not rec.channel.pending:
        rec.send(ident, urgent=True)
        return
    path = os.environ.get(SOCK_VAR)
    if not path:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # the watch is gone: train on, unrecorded
        sock.close()
        return
    rec.channel.attach(sock, ident)


def _patch_init(dist: Any, rec: Recorder) -> None:
    c10d = dist.distributed_c10d
    orig = c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        with contextlib.suppress(Exception):  # identity is a nicety; training goes on
            claim(dist, rec)
        return out

    init_process_group.__doc__ = orig.__doc__
    init_process_group.__wrapped__ = orig  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def report_child_exits(subprocess: ModuleType, rec: Recorder) -> None:
    """Tell the parent the exit status of every child this process reaps (``X``: pid, status).

    A rank's exit status belongs to its launcher (torchrun's workers, Lightning's rank 1 is rank
    0's child): only the process that reaps it learns it, and the watch parent is not that
    process. Python launchers reap through ``subprocess.Popen``, whose ``_handle_exitstatus``
    sets ``returncode``; we report it from there (negative = killed by that signal).
    """
    popen = subprocess.Popen
    orig = getattr(popen, "_handle_exitstatus", None)
    if orig is None:
        return

    def _handle_exitstatus(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        code = self.returncode
        if code is not None and rec.owner() and not rec.channel.pending:
            rec.send(["X", int(self.pid), int(code)], urgent=True)
        return out

    popen._handle_exitstatus = _handle_exitstatus


def _patch_destroy(dist: Any, rec: Recorder) -> None:
    c10d = dist.distributed_c10d
    orig = c10d.destroy_process_group

    def destroy_process_group(group: Any = None) -> Any:
        if group is None:
            try:
                ship_stores(dist, rec)
            except Exception as exc:  # never let the copy break the user's teardown
                rec.note("watch", f"rank stores not sent to rank 0: {type(exc).__name__}: {exc}")
        return orig(group)

    destroy_process_group.__doc__ = orig.__doc__
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def ship_stores(dist: Any, rec: Recorder) -> list[int]:
    """Multi-node: bring the stores rank 0's run directory lacks there, through the group.

    Each node's watch writes its own ranks' stores into its own run directory (on a shared file
    system too: give each node its own ``--out``). At the default group's teardown, while every
    rank is still in it, rank 0 says which ``run.rank<k>.db`` it lacks; those ranks ask their
    watch to commit, take a consistent snapshot (SQLite ``serialize``) and send it to rank 0
    (``gather_object``), which writes them beside its own store. Only when the job spans nodes
    (``LOCAL_WORLD_SIZE`` < ``WORLD_SIZE``): on one node nothing is added to the teardown.
    Returns the ranks whose stores rank 0 received.
    """
    world = int(dist.get_world_size())
    local_world = _env_int("LOCAL_WORLD_SIZE")
    if world < 2 or local_world is None or local_world >= world or not rec.once("ship"):
        return []
    from pathlib import Path

    from stepscope.atomic import atomic_write_bytes
    from stepscope.store.rundir import rank_db_name

    run_dir = os.environ.get(DIR_VAR) or ""
    rank = int(dist.get_rank())
    box: list[Any] = [None]
    if rank == 0:
        box[0] = [k for k in range(1, world)
                  if run_dir and not os.path.isfile(os.path.join(run_dir, rank_db_name(k)))]
    dist.broadcast_object_list(box, src=0)
    missing: list[int] = box[0] or []
    if not missing:
        return []
    mine = _snapshot(rec, run_dir, rank) if rank in missing else None
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return []
    got = [k for k in missing if gathered[k]]
    for k in got:
        # A reader never sees half a store.
        atomic_write_bytes(Path(run_dir) / rank_db_name(k), gathered[k])
    return got


def _snapshot(rec: Recorder, run_dir: str, rank: int) -> bytes | None:
    """This rank's store as its watch has committed it (asked to commit first when it can)."""
    import sqlite3

    from stepscope.store.rundir import rank_db_name

    sock = rec.channel.socket
    name = rank_db_name(0 if sock is None else rank)  # the first process writes run.db
    rec.send(["Q"], urgent=True)
    if sock is not None:  # the parent answers once everything sent so far is committed
        sock.settimeout(FLUSH_TIMEOUT_S)
        with contextlib.suppress(OSError):
            sock.recv(16)
        sock.settimeout(None)
    path = os.path.join(run_dir, name)
    if not os.path.isfile(path):
        return None
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return bytes(con.serialize())
    finally:
        con.close()


def _patch_ddp(torch: ModuleType, dist: Any, rec: Recorder) -> None:
    ddp_cls = torch.nn.parallel.DistributedDataParallel
    orig_forward = ddp_cls.forward
    orig_register = ddp_cls.register_comm_hook

    def register_comm_hook(self: Any, state: Any, hook: Any) -> Any:
        self.__dict__["_stepscope_user_hook"] = True
        return orig_register(self, state, hook)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "_stepscope_hooked" not in self.__dict__:
            self.__dict__["_stepscope_hooked"] = True
            _hook_model(self, dist, rec, orig_register)
        return orig_forward(self, *args, **kwargs)

    ddp_cls.register_comm_hook = register_comm_hook
    ddp_cls.forward = forward


def _hook_model(ddp: Any, dist: Any, rec: Recorder, register: Any) -> None:
    try:
        claim(dist, rec)
    except Exception as exc:
        rec.note("watch", f"rank identity not read: {type(exc).__name__}: {exc}")
    if ddp.__dict__.get("_stepscope_user_hook"):
        if rec.once("user-comm-hook"):
            rec.note("watch", "the script registered its own DDP comm hook: all-reduce arrival "
                              "times not measured")
        return
    try:
        register(ddp, ArrivalTimer(rec, ddp.process_group), timed_allreduce)
    except Exception as exc:
        rec.note("watch", f"all-reduce arrival hook not installed: {type(exc).__name__}: {exc}")


class ArrivalTimer:
    """The comm hook's state: the current step's buckets and the all-reduce sequence number.

    It holds the model's process group weakly. Each bucket's callback runs on a gloo worker
    thread and refers to this state; were the state an owner of the group, the last reference
    could be dropped on that thread once the script has let go of its model and destroyed the
    group, and ``~ProcessGroupGloo`` joining its own thread aborts the process ("terminate
    called after throwing an instance of 'std::system_error' ... Resource deadlock avoided",
    SIGABRT). DDP's own hook state owns nothing a worker thread could free.
    """

    def __init__(self, rec: Recorder, group: Any) -> None:
        self.rec = rec
        try:
            self._group: Callable[[], Any] = weakref.ref(group)
        except TypeError:  # None (the default group), or a group type without weak references
            self._group = lambda: group
        self.seq = 0
        self.buckets = 0
        self.comm_s = 0.0
        self._covered_until = -math.inf

    def group(self) -> Any:
        """The process group to reduce over (alive: the model being reduced holds it)."""
        return self._group()

    def done(self, t0: float, t1: float, last: bool) -> None:
        """A bucket's all-reduce completed (futures complete in order on one group)."""
        self.buckets += 1
        self.comm_s += max(0.0, t1 - max(t0, self._covered_until))
        self._covered_until = max(self._covered_until, t1)
        if not last:
            return
        rec = self.rec
        # Plain loops are timed by the loop tracker, framework loops by the recorder.
        tracker = getattr(sys.modules.get("stepscope_watch_loop"), "ACTIVE", None)
        if tracker is not None and tracker.cur is not None:
            tracker.add_comm(self.comm_s)
        else:
            rec.add_comm(self.comm_s)
        rec.send(["A", self.seq, rec.unix(t0), t1 - t0, self.comm_s, self.buckets])
        self.seq += 1
        self.buckets, self.comm_s, self._covered_until = 0, 0.0, -math.inf


def timed_allreduce(state: ArrivalTimer, bucket: Any) -> Any:
    """DDP's default all-reduce (average over the group), timed by ``state``."""
    import torch.distributed as dist

    tensor = bucket.buffer()
    t0 = state.rec.clock()
    last = bool(bucket.is_last())
    group = state.group()
    size = group.size() if group is not None else dist.get_world_size()
    # Divide first, as DDP's default hook does, so fp16 sums cannot overflow.
    work = dist.all_reduce(tensor.div_(size), group=group, async_op=True)

    def done(fut: Any) -> Any:
        state.done(t0, state.rec.clock(), last)
        return fut.value()[0]

    return work.get_future().then(done)


# DDP compares a hook's annotations with its own types by identity; these are strings here.
timed_allreduce.__annotations__ = {}
