"""Plain records that travel between layers. The store persists them; nothing here does I/O.

Units are in the names: ``_s`` seconds, ``_bytes`` bytes, ``_pct`` percent (0-100),
``_frac`` fraction (0-1). Times ``t``/``started``/``ended`` are Unix seconds (``time.time()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RUN_STATUSES = ("running", "completed", "failed", "interrupted")
PHASES = ("train", "val")


@dataclass
class RunInfo:
    """One row of the ``runs`` table: what ran, where, and how it ended."""

    name: str
    command: str
    device: str = "cpu"
    started: float = 0.0
    ended: float | None = None
    status: str = "running"
    pid: int = 0
    rank: int = 0
    world_size: int = 1
    kind: str = "train"  # train | watch | monitor (user's own loop)
    exit_code: int | None = None
    # free-form: the run's configuration as the loop gave it (JSON in the run row)
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class PhaseRecord:
    """One epoch x phase. ``resident_frac_*`` is the dataset's page-cache residency; the
    ``io_*`` fields are process-tree /proc/PID/io counters (cumulative) at start and end."""

    phase_id: int
    epoch: int
    phase: str
    started: float
    ended: float | None = None
    steps: int = 0
    images: int = 0
    resident_frac_start: float | None = None
    resident_frac_end: float | None = None
    read_bytes_start: int | None = None
    read_bytes_end: int | None = None
    rchar_start: int | None = None
    rchar_end: int | None = None
    workers: int | None = None
    rank: int = 0


@dataclass
class StepRecord:
    """One step. ``wall_s`` runs from the start of the data wait to the start of the next one,
    so ``data_wait_s + transfer_s + compute_s + other_s == wall_s`` by construction;
    ``other_s`` is everything the loop did outside the timed parts (logging, metrics, Python)."""

    phase_id: int
    step: int
    t_start: float
    wall_s: float
    data_wait_s: float
    transfer_s: float
    compute_s: float
    other_s: float
    images: int
    warmup: bool = False
    comm_s: float = 0.0  # distributed all-reduce time, when measured separately from compute
    loss: float | None = None


@dataclass
class ArrivalRecord:
    """This rank at its ``seq``-th gradient all-reduce (the step's last DDP bucket): when it
    handed the bucket over (``t_arrive``, Unix), how long it then waited for the all-reduce to
    complete (``wait_s``), the step's union of all-reduce intervals (``comm_s``) and its bucket
    count. Collectives run in the same order on every rank, so ``seq`` aligns ranks without
    trusting their clocks: whoever waits least at a collective arrived last."""

    seq: int
    t_arrive: float
    wait_s: float
    comm_s: float = 0.0
    buckets: int = 1


@dataclass
class Sample:
    """One sampled value in long format. ``source`` says whose value it is: ``host``, ``cpu3``,
    ``tree``, ``proc:<pid>``, ``disk:<dev>``, ``gpu0``, ``torch``; ``metric`` carries the unit."""

    t: float
    source: str
    metric: str
    value: float


@dataclass
class ProcessInfo:
    """A process of the observed tree. ``role`` is ``main``, ``worker`` (DataLoader), ``child``."""

    pid: int
    ppid: int
    role: str
    name: str
    first_t: float
    last_t: float


@dataclass
class Note:
    """A one-line remark, e.g. why a sampler is absent on this machine."""

    t: float
    source: str
    text: str


@dataclass
class Fact:
    """A measured quantity that is not a time series: model weight bytes, dataset bytes, the
    memory-ledger items, checkpoint write time. ``how_measured`` says where the number came from."""

    key: str
    value: Any
    how_measured: str = ""
