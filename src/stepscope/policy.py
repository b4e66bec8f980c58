"""The rules train, tune, doctor and the findings share: one definition each, so they agree.

This module sits below every layer (it imports nothing from stepscope and nothing heavy), so the
trainer (``--workers auto``), ``tune`` (its predictions), ``doctor`` (its advice) and the
analysis (its findings) all ask the same function:

- **cores**: what this job may use, the affinity mask capped by the cgroup CPU quota;
- **workers**: how many DataLoader processes, never more than those cores allow, and when
  loading in the main process (0 workers) beats a worker;
- **throughput model**: the rate a run reaches from its loader and trunk ceilings;
- **bf16**: when bf16 autocast pays on a device;
- **steady state**: which steps figures are computed from (warm-up steps left out);
- **weighted means** of per-phase figures over phases of different lengths.

Numbers are plain arguments, so each rule is tested without a machine, a model or a store.

Examples:
    >>> job_cores(affinity=16, quota_cores=2.5)
    2
    >>> auto_workers(loader_cores=0.1, cores=2, on_gpu=False), auto_workers(None, 8, on_gpu=True)
    (0, 7)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

# -- cores --------------------------------------------------------------------------------------


def job_cores(affinity: int, quota_cores: float | None) -> int:
    """Cores this job may use: the affinity mask, capped by the cgroup quota (at least 1).

    A quota of 1.5 cores lets two threads run for 75 % of each period: round down, since the
    half core is time the busiest thread spends throttled, not a core to schedule on.
    """
    if quota_cores is None:
        return max(1, affinity)
    return max(1, min(affinity, int(quota_cores)))


def job_cpu_capacity(affinity: float | None, quota_cores: float | None) -> float | None:
    """CPU time per second this job may use, in cores: affinity capped by the quota, the
    quota's fraction kept (1.5 cores of quota is 1.5 core-seconds per second of capacity, though
    only :func:`job_cores` = 1 core to schedule a worker on); None when neither is known.

    Examples:
        >>> job_cpu_capacity(16, 2.5), job_cpu_capacity(2, None), job_cpu_capacity(None, None)
        (2.5, 2.0, None)
    """
    vals = [float(v) for v in (affinity, quota_cores) if isinstance(v, (int, float)) and v > 0]
    return min(vals) if vals else None


STEAL_NOTABLE_FRAC = 0.05  # a VM's steal worth naming in the evidence
STEAL_MAX_FRAC = 0.9  # beyond it a VM's figures say nothing of what its processes wanted


def unstolen(steal_pct: float | None) -> float:
    """The share of each core's time a VM's processes could have: what the hypervisor did not
    run other guests in (``host`` ``steal_pct``). A process stopped so is neither on a CPU nor
    in the run queue (the kernel's paravirt accounting keeps steal out of both clocks), so a
    busy loop reads as ``1 - steal`` of a core, and the job's cores hold that much less.

    Examples:
        >>> unstolen(None), unstolen(30.0), round(unstolen(100.0), 2)
        (1.0, 0.7, 0.1)
    """
    return 1.0 - min(STEAL_MAX_FRAC, max(0.0, (steal_pct or 0.0) / 100.0))


# -- DataLoader workers ---------------------------------------------------------------------------

# Images per second one CPU worker delivers, by augmentation backend, measured on a 2-core
# Zen 5 / Xeon (REFERENCE.md): decode + augment + resize to ~299 px.
PER_WORKER_IMG_S: Mapping[str, float] = {"fused": 1400.0, "keras": 130.0, "none": 1000.0,
                                         "gpu": 1000.0}
DEFAULT_PER_WORKER_IMG_S = 500.0
# What the frozen trunk consumes on a CPU-only machine is rarely above this (EfficientNet-Lite0
# at 224 px, 2 cores, bf16); on a GPU the trunk is 10-100x faster and the CPU must feed it.
CPU_TRUNK_IMG_S = 120.0
# Load inline on a CPU-only machine while loading costs at most this share of one core.
# Measured on 2 cores, EfficientNet-Lite0 with the fused augmentation: at 128 px 162 img/s
# inline against 90-107 with one worker (`stepscope tune`); at 299 px 45 against 44 img/s
# (bench/pipeline_efficiency.py): a worker preempts the trunk's threads, and they wait for each
# other at every parallel region.
INLINE_LOADING_MAX_FRAC = 0.25
# More workers than this on a GPU machine only add processes that compete for the same memory
# bandwidth; PyTorch's own DataLoader warns above the core count.
GPU_MAX_WORKERS = 8


def max_workers(cores: int) -> int:
    """The most workers any rule proposes: every core but the one the main process needs
    (it runs the trunk's threads on a CPU, and launches the GPU work on a GPU); 1 on one core."""
    return max(1, cores - 1)


def auto_workers(loader_cores: float | None, cores: int, *, on_gpu: bool) -> int:
    """``--workers auto``: enough loader processes to feed the trunk, and no more.

    Args:
        loader_cores: cores' worth of loading the trunk's rate needs (its images/s over one
            core's loader images/s); None when unknown (then a GPU gets every spare core, up to
            ``GPU_MAX_WORKERS``).
        cores: the cores this job may use (:func:`job_cores`, or a rank's share of them).
        on_gpu: the trunk runs on a GPU, not on the same cores as the loader.

    Examples:
        >>> auto_workers(120 / 1400, 2, on_gpu=False), auto_workers(120 / 130, 2, on_gpu=False)
        (0, 1)
        >>> auto_workers(3.2, 16, on_gpu=True), auto_workers(50.0, 4, on_gpu=False)
        (4, 3)
    """
    cap = max_workers(cores)
    if on_gpu:
        if loader_cores is None:
            return min(cap, GPU_MAX_WORKERS)
        return min(cap, max(1, math.ceil(loader_cores - 1e-9)))
    need = loader_cores if loader_cores is not None else cap
    if need <= INLINE_LOADING_MAX_FRAC:
        return 0
    return min(cap, max(1, math.ceil(need - 1e-9)))


def default_loader_cores(backend: str) -> float:
    """Cores of loading a typical CPU trunk needs with ``backend`` (no measurement at hand)."""
    return CPU_TRUNK_IMG_S / PER_WORKER_IMG_S.get(backend, DEFAULT_PER_WORKER_IMG_S)


def more_workers(current: int, cores: int) -> int | None:
    """The worker count a finding proposes when the loop was *measured* waiting for data with
    cores to spare: double (at least 2), never past the job's cores; None when none would fit.

    Unlike :func:`auto_workers` (decided before anything ran, so the main process keeps a core
    for the trunk) the main process here sat idle in the loader's ``__next__``: its core is
    spare too, so the cap is every core, not every core but one.
    """
    target = min(cores, max(2, current * 2))
    return target if target > current else None


# -- throughput model ------------------------------------------------------------------------------


def predict_images_per_s(*, loader_w: float, loader_0: float, compute: float, workers: int,
                         cores: int, shared_cores: bool,
                         compute_core_s: float | None = None) -> float:
    """What a training run should reach, from the loader and trunk ceilings.

    With no workers the main process decodes, then computes, in turn: the times add. With
    workers loading overlaps computing, so the slower side sets the rate; but on a CPU-only
    machine both share the same cores, so the core-seconds per image add up again (an upper
    bound: it assumes perfect sharing).

    Args:
        loader_w: images/s the loader delivers with ``workers`` (``math.inf`` when unbounded).
        loader_0: images/s one core decodes and augments.
        compute: images/s the trunk runs at.
        workers: DataLoader workers.
        cores: cores the job may use.
        shared_cores: the trunk runs on the same cores as the loader (a CPU-only machine).
        compute_core_s: core-seconds the trunk spends per image; by default it is taken to
            run on all ``cores`` (``cores / compute``).

    Examples:
        >>> predict_images_per_s(loader_w=200, loader_0=100, compute=100, workers=0, cores=2,
        ...                      shared_cores=False)
        50.0
        >>> predict_images_per_s(loader_w=200, loader_0=100, compute=100, workers=2, cores=2,
        ...                      shared_cores=False)
        100
    """
    if workers == 0:
        return 1.0 / (1.0 / loader_0 + 1.0 / compute)
    rate = min(loader_w, compute)
    if shared_cores:
        trunk_core_s = compute_core_s if compute_core_s is not None else max(cores, 1) / compute
        rate = min(rate, max(cores, 1) / (trunk_core_s + 1.0 / loader_0))
    return rate


def chunk_rates(seconds: Sequence[float], images: Sequence[int], chunk: int) -> list[float]:
    """Images per second over consecutive chunks of ``chunk`` batches (or steps).

    With N workers batches arrive in bursts of N (each worker finishes one at about the same
    time), so single-batch rates alternate between near-infinite and slow; a chunk of N batches
    spans one full cycle. A short last chunk is dropped unless it is the only one.

    Examples:
        >>> chunk_rates([0.1, 0.0, 0.1, 0.0, 0.1], [8, 8, 8, 8, 8], 2)
        [160.0, 160.0]
    """
    chunk = max(chunk, 1)
    rates: list[float] = []
    for i in range(0, len(seconds), chunk):
        s, n = seconds[i:i + chunk], images[i:i + chunk]
        if len(s) < chunk and rates:
            break
        rates.append(sum(n) / max(sum(s), 1e-9))
    return rates


# -- bf16 ------------------------------------------------------------------------------------------

# CPU flags that mean the cores have native bf16 arithmetic: AVX-512 BF16 (dot products of
# bf16 pairs into fp32, Cooper Lake / Zen 4+) and AMX-BF16 (tile matrix units, Sapphire Rapids+).
# oneDNN, which runs PyTorch's CPU convolutions, uses either when present; without them PyTorch
# emulates bf16 through fp32 and it is slower.
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(flags: Iterable[str]) -> bool:
    """True when the CPU flags include native bf16 arithmetic."""
    return bool(BF16_CPU_FLAGS & set(flags))


def bf16_pays(device_type: str, *, cpu_flags: Iterable[str] = (),
              cuda_native_bf16: bool = False) -> bool:
    """Whether bf16 autocast is expected to speed up training on a device of ``device_type``.

    CUDA: GPUs from Ampere (compute capability 8.0) on have bf16 tensor cores; older ones only
    emulate it (``cuda_native_bf16`` is ``torch.cuda.is_bf16_supported(including_emulation=False)``).
    CPU: only with the native bf16 flags; otherwise oneDNN converts to fp32 and back and loses.
    """
    if device_type == "cuda":
        return cuda_native_bf16
    if device_type == "cpu":
        return cpu_has_native_bf16(cpu_flags)
    return False


def use_bf16(precision: str, pays: bool) -> bool:
    """``--precision``: ``bf16`` always, ``auto`` where it pays, anything else never."""
    return precision == "bf16" or (precision == "auto" and pays)


# -- steady state ------------------------------------------------------------------------------------


class HasWarmup(Protocol):
    @property
    def warmup(self) -> bool: ...


StepT = TypeVar("StepT", bound=HasWarmup)


def steady_steps(steps: Sequence[StepT]) -> tuple[list[StepT], bool]:
    """The steps steady-state figures use: those after warm-up; all of them (and ``False``) when
    none is steady, so a short phase still has figures, flagged as not steady.

    Examples:
        >>> from types import SimpleNamespace as S
        >>> kept, steady = steady_steps([S(warmup=True), S(warmup=False)])
        >>> len(kept), steady
        (1, True)
    """
    steady = [s for s in steps if not s.warmup]
    return (steady, True) if steady else (list(steps), False)


# -- weighted means ------------------------------------------------------------------------------


def weighted_mean(rows: Iterable[Mapping[str, object]], key: str,
                  weight: str = "seconds") -> float | None:
    """``weight``-weighted mean of ``rows[key]`` over the rows that have it (None if none do);
    the plain mean when every weight is 0.

    Examples:
        >>> weighted_mean([{"x": 1.0, "seconds": 3.0}, {"x": 5.0, "seconds": 1.0}], "x")
        2.0
    """
    pairs = [(float(v), float(w)) for r in rows
             if isinstance(v := r.get(key), (int, float))
             and isinstance(w := r.get(weight, 0.0), (int, float))]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total > 0:
        return sum(v * w for v, w in pairs) / total
    return sum(v for v, _ in pairs) / len(pairs)


__all__ = [
    "BF16_CPU_FLAGS",
    "CPU_TRUNK_IMG_S",
    "INLINE_LOADING_MAX_FRAC",
    "PER_WORKER_IMG_S",
    "auto_workers",
    "bf16_pays",
    "chunk_rates",
    "cpu_has_native_bf16",
    "default_loader_cores",
    "job_cores",
    "job_cpu_capacity",
    "max_workers",
    "more_workers",
    "predict_images_per_s",
    "steady_steps",
    "use_bf16",
    "weighted_mean",
]
