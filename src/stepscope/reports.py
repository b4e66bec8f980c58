"""Typed contracts for the doctor's report and tune's result.

Both are measured in ``train/`` (``train/doctor.py``, ``train/tune.py``), decided on and worded
in ``analysis/`` and shown by ``render/`` (tables, ``--json``). ``train/`` may not import
``analysis/``, so these contracts live below every layer, like ``policy.py``: this module
imports nothing from stepscope. They are ``TypedDict``s, so the report stays the plain
JSON-ready dict ``doctor --json`` and ``tune --json`` print, unchanged.

The doctor's sections mirror dataclasses of ``observe/machine.py`` and ``train/ceilings.py``
field for field (``dataclasses.asdict``); ``tests/test_contracts.py`` holds them to it.
"""

from __future__ import annotations

from typing import TypedDict


class CpuReport(TypedDict):
    """``report["cpu"]``: ``observe.machine.CpuFacts`` plus whether the CPU has native bf16."""

    model_name: str
    logical_cpus: int
    affinity_cores: int
    quota_cores: float | None
    usable_cores: int
    isa: dict[str, bool]  # instruction-set flags: avx2, avx512f, amx...
    load_avg_1m: float
    bf16_native: bool


class MemoryReport(TypedDict):
    """``report["memory"]``: ``observe.machine.MemoryFacts``."""

    total_bytes: int
    available_bytes: int
    cached_bytes: int
    cgroup_limit_bytes: int | None


class GpuDeviceRow(TypedDict):
    """One of ``report["gpu"]["devices"]``: ``observe.machine.GpuDevice``."""

    index: int
    name: str
    memory_total_bytes: int | None
    compute_capability: str | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_max_gen: int | None
    pcie_max_width: int | None


class GpuReport(TypedDict):
    """``report["gpu"]``: ``observe.machine.GpuFacts`` plus what PyTorch itself sees."""

    nvml: bool
    reason: str
    driver_version: str | None
    cuda_driver_version: str | None
    devices: list[GpuDeviceRow]
    notes: list[str]
    torch_cuda_available: bool
    torch_device_count: int
    torch_cuda_version: str | None


class ReadSpeedRow(TypedDict):
    """``report["storage"]["read"]``: ``observe.machine.ReadSpeed`` (a cold read)."""

    files: int
    bytes: int
    seconds: float
    mb_per_s: float
    files_per_s: float
    cold_frac: float


class StorageReport(TypedDict):
    """``report["storage"]`` (with ``--data``): the dataset's mount
    (``observe.machine.MountFacts``), size, page-cache residency and a cold read."""

    path: str
    fstype: str
    mount_point: str
    source: str
    block_device: str | None
    rotational: bool | None
    files: int
    dataset_bytes: int
    resident_frac: float | None
    resident_sampled_files: int
    read: ReadSpeedRow | None


class CapabilityRow(TypedDict):
    """One of ``report["capabilities"]``: ``observe.machine.Capability``."""

    name: str
    available: bool
    reason: str


class TrainingPlan(TypedDict):
    """``report["training"]``: the training the ceilings were measured for."""

    device: str  # "cpu" | "cuda"
    threads: int | None  # torch CPU threads (None on a GPU)
    model: str
    img_size: int
    batch_size: int
    augment: str
    aug_backend: str
    bf16_pays: bool
    precision: str  # "bf16" | "fp32"
    channels_last: bool


class CeilingRow(TypedDict):
    """One measured ceiling: ``train.ceilings.Ceiling``."""

    name: str
    images_per_s: float
    min_images_per_s: float
    max_images_per_s: float
    batches: int
    batch_size: int
    seconds: float
    warmup_s: float
    threads: int
    includes: str


class Ceilings(TypedDict):
    """``report["ceilings"]``: decode (plain, with augmentation) and the trunk's forward pass;
    None where not measured (``augment none``, bf16 where it does not pay)."""

    decode: CeilingRow
    decode_augment: CeilingRow | None
    forward_fp32: CeilingRow
    forward_bf16: CeilingRow | None


def measured_ceilings(c: Ceilings) -> list[tuple[str, CeilingRow]]:
    """The ceilings that were measured, by key, in the report's order."""
    rows = (("decode", c["decode"]), ("decode_augment", c["decode_augment"]),
            ("forward_fp32", c["forward_fp32"]), ("forward_bf16", c["forward_bf16"]))
    return [(k, row) for k, row in rows if row]


class _DoctorCore(TypedDict):

    schema_version: int
    cpu: CpuReport
    memory: MemoryReport
    gpu: GpuReport
    storage: StorageReport | None
    capabilities: list[CapabilityRow]
    training: TrainingPlan
    ceilings: Ceilings
    elapsed_s: float


class DoctorReport(_DoctorCore, total=False):
    """What ``stepscope doctor`` measured (``train.doctor.run_doctor``), and the two predictions
    ``analysis.doctor`` makes from it, which the CLI adds before ``--json``."""

    prediction: str
    cache_prediction: str | None


class _EpochCore(TypedDict):
    epoch: int  # from 1, as metrics.csv and Keras print it
    train_loss: float
    train_accuracy: float
    seconds: float


class EpochMetrics(_EpochCore, total=False):
    """One epoch of ``stepscope train``: a row of ``metrics.csv`` and of the progress line, kept
    in the checkpoints. The validation figures exist for the epochs that validated."""

    val_loss: float
    val_accuracy: float


def epoch_metric(row: EpochMetrics, name: str) -> float | None:
    """``row``'s ``val_accuracy`` or ``val_loss`` (what ``--monitor`` names); None otherwise."""
    if name == "val_accuracy":
        return row.get("val_accuracy")
    if name == "val_loss":
        return row.get("val_loss")
    return None


class TunedSettings(TypedDict, total=False):
    """The tuned TrainConfig keys (``train.tune.TUNED_KEYS``). Total=False: a compute or
    loader-only row changes some of them; a full candidate and the winner set all five."""

    workers: str  # a string, as on the CLI and in TrainConfig ("auto" is never tuned to)
    prefetch: int
    aug_backend: str  # fused | keras | gpu
    precision: str  # fp32 | bf16, resolved
    channels_last: bool


class TuneRowDict(TypedDict):
    """One of tune's measurements as plain data (``train.tune.TuneRow``, ``tune --json``)."""

    kind: str  # compute | loader | run
    label: str
    changes: TunedSettings
    images_per_s: float | None
    min_images_per_s: float | None
    max_images_per_s: float | None
    measured: str
    seconds: float
    predicted_images_per_s: float | None
    capacity_speedup: float | None
    achieved_speedup: float | None
    data_wait_frac: float | None
    baseline: bool
    winner: bool
    skipped: str | None


class TuneResultDict(TypedDict):
    """``train.tune.TuneResult.to_dict()``: what ``tune --json`` reports."""

    rows: list[TuneRowDict]
    winner: TunedSettings
    reason: str
    notes: list[str]
    budget_s: float
    elapsed_s: float
    device: str
    baseline_workers_curve: dict[str, float]


__all__ = ["CapabilityRow", "CeilingRow", "Ceilings", "CpuReport", "DoctorReport", "EpochMetrics",
           "GpuDeviceRow", "GpuReport", "MemoryReport", "ReadSpeedRow", "StorageReport",
           "TrainingPlan", "TuneResultDict", "TuneRowDict", "TunedSettings", "epoch_metric",
           "measured_ceilings"]
