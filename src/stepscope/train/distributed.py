"""Data-parallel training under ``torchrun``: process group, DDP, sharded data, per-rank stores.

``torchrun --nproc-per-node N -m stepscope train ...`` starts N copies of the trainer with
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in the environment.
:meth:`Dist.from_env` reads them; with ``WORLD_SIZE`` 1 (or unset) every method here is a no-op,
so the loop has one code path.

What each rank does:

- joins the process group (``gloo`` on the CPU, ``nccl`` on CUDA, one GPU per local rank);
- trains through :class:`~torch.nn.parallel.DistributedDataParallel` on its shard of the training
  set (``DistributedSampler``, reshuffled per epoch with ``set_epoch``) and validates its own
  slice of the validation set (no padding, so the reduced metrics count every image once);
- records its own store: rank 0 keeps ``run.db`` (so every single-run tool still reads the
  primary rank), rank k writes ``run.rank<k>.db`` in the same run directory. No two processes
  ever write one SQLite file;
- samples its own process tree (main process and *its* DataLoader workers: CPU, memory,
  ``/proc/PID/io``). Host-wide series (host CPU and memory, disks, page-cache residency, GPUs)
  are sampled only by local rank 0 of each node: they are the same machine for every rank.

Only rank 0 writes ``config.yaml``, ``metrics.csv`` and checkpoints, and prints progress. Loss
and accuracy are all-reduced once per phase (sums of loss, correct and images), never per step.

``comm_s`` (the step's communication time): DDP all-reduces gradients inside ``backward()``,
bucket by bucket, as their gradients become ready. A comm hook (:class:`CommTimer`) wraps the
default all-reduce and records, for each bucket, the time from the moment DDP hands it over to
the moment its all-reduce future completes. A step's ``comm_s`` is the union of those intervals:
the wall time during which at least one gradient all-reduce was in flight. It includes waiting
for the slowest rank to arrive (a straggler shows up as *other* ranks' ``comm_s``), and is
taken out of ``compute_s``, so compute + comm is still the step's forward-backward-optimizer
time; backward work that overlaps communication is counted as comm. On CUDA the interval is
timed with CUDA events on the gradient's stream (start) and the all-reduce's stream (end).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from stepscope.atomic import atomic_write_bytes
from stepscope.errors import StepscopeError
from stepscope.observe.monitor import Monitor
from stepscope.observe.steps import StepTimer
from stepscope.store.records import ArrivalRecord
from stepscope.store.rundir import RunDir, rank_db_name
from stepscope.train.config import TrainConfig
from stepscope.train.setup import Setup, resolve_workers, usable_cores

# Tests only: make this rank a real input straggler (inline loading, the seed's slow SciPy
# augmentation) while the others keep fast workers. Not a user option.
SLOW_RANK_ENV = "STEPSCOPE_TEST_SLOW_RANK"
# How long a rank waits for the others at a collective before giving up with an error.
DEFAULT_TIMEOUT_S = 600.0


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world, ...``: every item once over all ranks, no padding.

    For validation: ranks may get one batch more or less, which is fine because validation
    runs no collective per step; the phase's sums are all-reduced once at its end.
    """

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.length, self.rank, self.world_size = length, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


@dataclass
class CommTimer:
    """A DDP comm hook that all-reduces like the default one and times it (see module doc).

    Each bucket's interval is added to the current step of ``timer`` as ``comm_s`` and taken out
    of its ``compute_s``. Intervals are merged as they complete: time already covered by an
    earlier bucket of the same step is not counted twice.
    """

    timer: StepTimer
    clock: Callable[[], float] = time.perf_counter
    on_arrival: Callable[[ArrivalRecord], None] | None = None
    buckets: int = 0
    seq: int = 0
    _covered_until: float = -math.inf
    _step_key: tuple[int, int] | None = None
    _gpu_pair: tuple[str, Any, Any] | None = None
    _step_comm_s: float = 0.0
    _step_buckets: int = 0
    _unix_offset: float = field(default_factory=lambda: time.time() - time.perf_counter())

    def register(self, ddp: DistributedDataParallel) -> None:
        ddp.register_comm_hook(self, timed_allreduce_hook)

    def add_interval(self, t0: float, t1: float, gpu_start: Any, last: bool = False) -> None:
        step = self.timer.current
        if step is None:
            return
        key = (step.phase_id, step.step)
        if key != self._step_key:
            self._step_key, self._covered_until, self._gpu_pair = key, -math.inf, None
            self._step_comm_s, self._step_buckets = 0.0, 0
        if gpu_start is not None:
            if step.gpu_pairs is None:  # the step's first GPU-timed region
                step.gpu_pairs = []
            self._gpu_interval(step.gpu_pairs, gpu_start)
        dt = max(0.0, t1 - max(t0, self._covered_until))
        self._covered_until = max(self._covered_until, t1)
        step.comm_s += dt
        step.compute_s -= dt
        self._step_comm_s += dt
        self._step_buckets += 1
        if last:
            self._arrived(t0, t1)

    def _arrived(self, t0: float, t1: float) -> None:
        """The step's last bucket: when this rank handed it over and how long it then waited
        (``analysis/arrivals.py`` names the rank the others wait for from these)."""
        if self.on_arrival is not None:
            self.on_arrival(ArrivalRecord(seq=self.seq, t_arrive=t0 + self._unix_offset,
                                          wait_s=t1 - t0, comm_s=self._step_comm_s,
                                          buckets=self._step_buckets))
        self.seq += 1


    def _gpu_interval(self, pairs: list[tuple[str, Any, Any]], start: Any) -> None:
        # CUDA runs a future's callbacks on streams made to wait for its work, so an event
        # recorded here completes when the all-reduce has. Buckets finish in order on one NCCL
        # stream: the step's GPU interval runs from its first bucket's start to the latest end.
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        if self._gpu_pair is not None:
            pairs.remove(self._gpu_pair)
            start = self._gpu_pair[1]
        self._gpu_pair = ("comm", start, end)
        pairs.append(self._gpu_pair)


def timed_allreduce_hook(
    timer: CommTimer, bucket: tdist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's default all-reduce (average of the bucket over ranks), timed by ``timer``."""
    tensor = bucket.buffer()
    t0 = timer.clock()
    last = bool(bucket.is_last())
    gpu_start = _cuda_event(tensor)
    # Divide first, as DDP's default hook does, so fp16 sums cannot overflow.
    work = tdist.all_reduce(tensor.div_(tdist.get_world_size()), async_op=True)
    assert work is not None
    timer.buckets += 1

    def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        # gloo: runs on its thread once the reduction is done. NCCL: runs once the work is
        # enqueued; the CUDA events then carry the real duration.
        timer.add_interval(t0, timer.clock(), gpu_start, last)
        return f.value()[0]

    return work.get_future().then(done)


# DDP checks a hook's annotations by identity; this module's string annotations would fail it.
timed_allreduce_hook.__annotations__.update(
    bucket=tdist.GradBucket, timer=CommTimer, **{"return": torch.futures.Future[torch.Tensor]}
)


def _cuda_event(tensor: torch.Tensor) -> Any:
    if not tensor.is_cuda:
        return None
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


@dataclass
class Dist:
    """This process's place in a distributed job (world size 1: not distributed).

    Examples:
        >>> dist = Dist.from_env()          # RANK/WORLD_SIZE from torchrun, or a single process
        >>> cfg = dist.resolve_config(cfg)  # per-rank device, threads, workers
        >>> dist.init(cfg)
        >>> mon = Monitor(run_dir, rank=dist.rank, world_size=dist.world_size, db_name=dist.db_name)
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None
    ddp: DistributedDataParallel | None = None
    comm: CommTimer | None = None
    samplers: list[Any] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Dist:
        """Read torchrun's variables; absent means a single process."""
        env = os.environ if env is None else env
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        if not 0 <= rank < max(world, 1):
            raise StepscopeError(f"RANK={rank} is outside WORLD_SIZE={world}: start with torchrun")
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(rank=rank, world_size=world, local_rank=int(env.get("LOCAL_RANK", "0")),
                   local_world_size=local_world)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def db_name(self) -> str:
        return rank_db_name(self.rank)

    # -- before the run ------------------------------------------------------------------
    def resolve_config(self, cfg: TrainConfig, env: Mapping[str, str] | None = None) -> TrainConfig:
        """This rank's share of the node: its GPU, its torch threads, its workers."""
        if not self.enabled:
            return cfg
        # free-form: TrainConfig fields to replace, by name
        changes: dict[str, Any] = {}
        cores = max(1, usable_cores() // self.local_world_size)
        cuda = cfg.device in ("auto", "cuda") and torch.cuda.is_available()
        if cuda:
            changes["device"] = f"cuda:{self.local_rank}"
        if cfg.threads is None:
            # Every rank on a node would otherwise start one thread per core: N ranks, N× the
            # cores, and the OS time-slices them (torchrun's OMP_NUM_THREADS=1 is the other
            # extreme). Each rank gets its share of the cores.
            changes["threads"] = cores
        if cfg.workers == "auto":
            # setup's --workers auto rule, applied to this rank's share of the cores.
            changes["workers"] = str(resolve_workers(
                "auto", cores=cores, device=torch.device("cuda" if cuda else "cpu"),
                backend=cfg.aug_backend))
        env = os.environ if env is None else env
        if env.get(SLOW_RANK_ENV) == str(self.rank):
            changes.update(workers="0", aug_backend="keras")
        return dataclasses.replace(cfg, **changes)

    def init(self, cfg: TrainConfig) -> None:
        """Join the process group: NCCL when this rank trains on a GPU, else gloo."""
        if not self.enabled or tdist.is_initialized():
            return
        cuda = cfg.device.startswith("cuda")
        self.backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(torch.device(cfg.device))
        tdist.init_process_group(self.backend, timeout=_dt.timedelta(seconds=self.timeout_s))

    def agree_path(self, path: Path) -> Path:
        """Rank 0's run directory for every rank (a default name holds the time of day)."""
        if not self.enabled:
            return path
        box: list[Any] = [str(path)]
        tdist.broadcast_object_list(box, src=0)
        return Path(box[0])

    def barrier(self) -> None:
        if self.enabled:
            tdist.barrier()

    # -- around the loop -----------------------------------------------------------------
    def prepare(self, s: Setup, mon: Monitor, *, unfrozen: bool) -> None:
        """Shard ``s``'s loaders, wrap its model in DDP timed by a comm hook (``s.ddp``)."""
        if not self.enabled:
            return
        s.train_loader = self._shard(s.train_loader, train=True, seed=_loader_seed(s))
        if s.val_loader is not None:
            s.val_loader = self._shard(s.val_loader, train=False, seed=0)
        device_ids = [s.device.index] if s.device.type == "cuda" else None
        # A frozen trunk's BatchNorm buffers never change (it stays in eval mode), so broadcasting
        # them from rank 0 before every forward would be a collective per step for nothing.
        # Parameters and buffers are still made identical once, here, from rank 0.
        self.ddp = DistributedDataParallel(s.model, device_ids=device_ids,
                                           forward_sync_buffers=unfrozen)
        self.comm = CommTimer(mon.timer, on_arrival=mon.writer.add_arrival
                              if mon.writer is not None else None)
        self.comm.register(self.ddp)
        s.ddp = self.ddp
        mon.fact("dist.world_size", self.world_size, "WORLD_SIZE from torchrun")
        mon.fact("dist.backend", self.backend, "torch.distributed process group backend")
        mon.fact("dist.local_rank", self.local_rank, "LOCAL_RANK from torchrun")
        mon.fact("dist.host", os.uname().nodename, "os.uname().nodename")

    def _shard(self, loader: Any, *, train: bool, seed: int) -> Any:
        if not isinstance(loader, DataLoader):
            return loader  # something custom (e.g. a feature cache): it shards itself
        n = len(loader.dataset)  # type: ignore[arg-type]
        sampler: Sampler[int] = (
            DistributedSampler(loader.dataset, num_replicas=self.world_size, rank=self.rank,
                               shuffle=True, seed=seed)
            if train else ShardSampler(n, self.rank, self.world_size)
        )
        self.samplers.append(sampler)
        # free-form: DataLoader keyword arguments handed on
        extra: dict[str, Any] = {}
        if loader.num_workers > 0:
            extra["prefetch_factor"] = loader.prefetch_factor
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                          num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                          pin_memory=loader.pin_memory, **extra)

    def limit_cache(self, cache: Any) -> None:
        """Keep a feature cache to validation: a cached train step would bypass DDP.

        The cached train phase calls the head directly; DDP all-reduces gradients only for
        steps that went through its own forward, so the ranks' heads would silently diverge.
        """
        if self.enabled and cache is not None and "train" in cache.phases:
            cache.phases = frozenset(cache.phases - {"train"})

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle the training shards: the same order on every rank, new every epoch."""
        for sampler in self.samplers:
            if isinstance(sampler, DistributedSampler):
                sampler.set_epoch(epoch)

    def reduce_means(self, loss: float, accuracy: float, images: int) -> tuple[float, float, int]:
        """A phase's loss and accuracy over every rank's images (weighted by image count)."""
        if not self.enabled:
            return loss, accuracy, images
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")
        sums = torch.tensor([loss * images, accuracy * images, float(images)],
                            dtype=torch.float64, device=device)
        tdist.all_reduce(sums)
        total = float(sums[2])
        if total <= 0:
            return 0.0, 0.0, 0
        return float(sums[0]) / total, float(sums[1]) / total, round(total)

    def finish(self, run_dir: Path) -> None:
        """After a completed run: bring every rank's store to rank 0's run directory, leave."""
        if not self.enabled or not tdist.is_initialized():
            return
        tdist.barrier()  # every store is closed before rank 0 looks for them
        collect_rank_stores(self, Path(run_dir))
        tdist.destroy_process_group()

    def abort(self) -> None:
        """After a failure: leave the group without waiting for the others."""
        if self.enabled and tdist.is_initialized():
            tdist.destroy_process_group()


def _loader_seed(s: Setup) -> int:
    gen = getattr(s.train_loader, "generator", None)
    return int(gen.initial_seed()) if gen is not None else 0


def collect_rank_stores(dist: Dist, run_dir: Path) -> list[int]:
    """Copy the stores rank 0 cannot see (another node's disk) into rank 0's run directory.

    On a shared file system every ``run.rank<k>.db`` is already there and nothing is sent.
    Returns the ranks whose stores were sent.
    """
    missing: list[Any] = [None]
    if dist.is_primary:
        missing[0] = [k for k in range(1, dist.world_size)
                      if not RunDir(run_dir).rank_db(k).is_file()]
    tdist.broadcast_object_list(missing, src=0)
    ranks: list[int] = missing[0]
    if not ranks:
        return []
    mine = RunDir(run_dir).rank_db(dist.rank).read_bytes() if dist.rank in ranks else None
    gathered: list[Any] | None = [None] * dist.world_size if dist.is_primary else None
    tdist.gather_object(mine, gathered, dst=0)
    if dist.is_primary and gathered is not None:
        for k in ranks:
            if gathered[k] is not None:
                atomic_write_bytes(RunDir(run_dir).rank_db(k), gathered[k])
    return ranks


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m stepscope ARGV``."""
    if nproc < 1:
        raise StepscopeError(f"--nproc must be >= 1, got {nproc}")
    # --standalone: a one-node rendezvous on a free local port, no endpoint to give.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", "-m", "stepscope", *argv]


def launch_local(nproc: int, argv: list[str]) -> int:
    """Run ``stepscope ARGV`` as ``nproc`` ranks on this machine under torchrun; its exit code.

    Examples:
        >>> launch_local(2, ["train", "--csv", "d/train.csv", "--images", "d/images"])
        0
    """
    return subprocess.call(torchrun_command(nproc, argv))


def without_flag(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--nproc 2`` or ``--nproc=2``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out
