"""The doctor's verdicts: which side of the training step will wait, and what the page cache will do.

Pure functions of the report ``train.doctor.run_doctor`` returns (a plain dict), so they are
tested with hand-made reports.

The bottleneck model. Per image, the loader spends ``1/D`` core-seconds (D: one core's decode +
augmentation rate) and the trunk ``1/F`` seconds (F: its forward rate).

- On a GPU the trunk runs there; the main process needs about one core to feed it, the loader
  gets the rest, ``L = cores - 1``. The loader delivers ``D * L``; below ``F`` the GPU waits.
- On the CPU both share the same cores. The trunk ran at ``F`` on ``t`` threads, so it costs
  ``t/F`` core-seconds per image; the loader ``1/D``. Whichever costs more core time per image
  is the bottleneck, and the machine sustains ``R = cores / (t/F + 1/D)`` images per second at
  most (never more than ``F``). The loader then needs ``R/D`` cores' worth of workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from stepscope import policy
from stepscope.analysis.fmt import fmt_bytes, fmt_pct, fmt_rate
from stepscope.reports import CeilingRow, DoctorReport, measured_ceilings

Side = Literal["input", "model"]

# A dataset taking more than this share of available memory competes with the training
# process itself (model, workers, pinned buffers) for the cache: call it a tight fit.
TIGHT_FIT_FRAC = 0.5
# Median vs slowest batch: beyond this ratio other work on the machine disturbed the timing.
NOISY_SPREAD = 2.0


@dataclass(frozen=True)
class Bottleneck:
    """The bottleneck estimate behind :func:`prediction`.

    Attributes:
        side: ``"input"`` (the loader cannot keep up) or ``"model"`` (the trunk is slower).
        device: ``"cpu"`` or ``"cuda"``.
        trunk_images_per_s: the trunk's rate in the precision training uses.
        trunk_precision: ``"fp32"`` or ``"bf16"``.
        fp32_images_per_s: the fp32 rate.
        bf16_images_per_s: the bf16 rate, None when not measured.
        trunk_threads: CPU threads the trunk ran on (None on a GPU).
        loader_images_per_s_per_core: one core's decode (+ augmentation) rate.
        augmented: whether that rate includes the augmentation.
        cores: cores usable by the process.
        loader_cores: cores the loader can use (GPU) or needs at the expected rate (CPU).
        workers: DataLoader workers to use.
        expected_images_per_s: the rate training can reach with that many workers.
    """

    side: Side
    device: str
    trunk_images_per_s: float
    trunk_precision: str
    fp32_images_per_s: float
    bf16_images_per_s: float | None
    trunk_threads: int | None
    loader_images_per_s_per_core: float
    augmented: bool
    cores: int
    loader_cores: float
    workers: int
    expected_images_per_s: float


def _rate(ceiling: CeilingRow | None) -> float | None:
    return None if not ceiling else float(ceiling["images_per_s"])


def bottleneck(report: DoctorReport) -> Bottleneck:
    """Which side will wait, from the report's ceilings, device and cores.

    Raises:
        ValueError: the report lacks the fp32 forward or the decode ceiling.

    Examples:
        >>> bottleneck(report).side  # doctest: +SKIP
        'model'
    """
    ceil, training = report["ceilings"], report["training"]
    fp32, bf16 = _rate(ceil.get("forward_fp32")), _rate(ceil.get("forward_bf16"))
    loader = _rate(ceil.get("decode_augment")) or _rate(ceil.get("decode"))
    if fp32 is None or loader is None:
        raise ValueError("the report has no forward_fp32 or decode ceiling to compare")
    use_bf16 = training.get("precision") == "bf16" and bf16 is not None
    trunk = bf16 if use_bf16 and bf16 is not None else fp32
    cores = max(1, int(report["cpu"]["usable_cores"]))
    threads: int | None = None
    if training.get("device", "cpu") != "cpu":
        spare = policy.max_workers(cores)  # one core launches the GPU work in the main process
        workers = policy.auto_workers(trunk / loader, cores, on_gpu=True)
        side: Side = "input" if loader * spare < trunk else "model"
        loader_cores = float(spare)
        expected = policy.predict_images_per_s(
            loader_w=loader * workers, loader_0=loader, compute=trunk, workers=workers,
            cores=cores, shared_cores=False)
    else:
        threads = int(training.get("threads") or ceil["forward_fp32"].get("threads") or cores)
        trunk_core_s, loader_core_s = threads / trunk, 1.0 / loader
        # Workers overlap loading with the trunk, but on the same cores: core-seconds add up.
        expected = policy.predict_images_per_s(
            loader_w=math.inf, loader_0=loader, compute=trunk, workers=1, cores=cores,
            shared_cores=True, compute_core_s=trunk_core_s)
        loader_cores = expected / loader
        # The trainer's --workers auto rule: load inline when it costs little of a core.
        workers = policy.auto_workers(loader_cores, cores, on_gpu=False)
        side = "model" if trunk_core_s >= loader_core_s else "input"
    return Bottleneck(
        side=side, device=str(training.get("device", "cpu")), trunk_images_per_s=trunk,
        trunk_precision="bf16" if use_bf16 else "fp32", fp32_images_per_s=fp32,
        bf16_images_per_s=bf16, trunk_threads=threads, loader_images_per_s_per_core=loader,
        augmented=bool(ceil.get("decode_augment")), cores=cores, loader_cores=loader_cores,
        workers=workers, expected_images_per_s=expected,
    )


def _trunk_words(b: Bottleneck) -> str:
    where = "on the GPU" if b.device != "cpu" else f"on {b.trunk_threads} CPU thread(s)"
    text = f"the trunk runs at {fmt_rate(b.fp32_images_per_s)} img/s {where}"
    if b.bf16_images_per_s is not None:
        used = ", which training uses" if b.trunk_precision == "bf16" else ""
        text += f" (bf16{used}: {fmt_rate(b.bf16_images_per_s)})"
    return text


def prediction(report: DoctorReport) -> str:
    """The one-sentence verdict: will the input pipeline or the model be the bottleneck?

    Examples:
        >>> prediction(report)  # doctest: +SKIP
        'The model will be the bottleneck: the trunk runs at 8.5 img/s on 2 CPU thread(s)
        (bf16, which training uses: 23.5) while one core decodes and augments 1,400 img/s;
        loading in the main process (--workers 0) costs it under a quarter of a core
        (expect about 23.3 img/s).'
    """
    b = bottleneck(report)
    loader = (f"one core decodes{' and augments' if b.augmented else ''} "
              f"{fmt_rate(b.loader_images_per_s_per_core)} img/s")
    expect = f"expect about {fmt_rate(b.expected_images_per_s)} img/s"
    if b.side == "model":
        verb = "is" if b.workers == 1 else "are"
        feed = (f"{b.workers} worker{'s' if b.workers > 1 else ''} {verb} enough" if b.workers
                else "loading in the main process (--workers 0) costs it under a quarter of a core")
        return (f"The model will be the bottleneck: {_trunk_words(b)} while {loader}; "
                f"{feed} ({expect}).")
    if b.device != "cpu":
        spare = int(b.loader_cores)
        wait = 1.0 - b.expected_images_per_s / b.trunk_images_per_s
        return (f"The input pipeline will be the bottleneck: {loader}, so the {spare} core(s) "
                f"left for the loader deliver about "
                f"{fmt_rate(b.loader_images_per_s_per_core * spare)} img/s while {_trunk_words(b)}; "
                f"the GPU will wait about {fmt_pct(wait)} of each step.")
    share = (1.0 / b.loader_images_per_s_per_core) / (
        1.0 / b.loader_images_per_s_per_core + (b.trunk_threads or 1) / b.trunk_images_per_s)
    return (f"The input pipeline will be the bottleneck: {loader} while {_trunk_words(b)}; "
            f"decoding takes {fmt_pct(share)} of the CPU time, so {expect} with "
            f"{b.workers} worker{'s' if b.workers > 1 else ''} on {b.cores} core(s).")


def cache_prediction(report: DoctorReport) -> str | None:
    """Whether the page cache will hold the dataset, i.e. whether the disk goes quiet after
    epoch 1; None without a storage section.

    Examples:
        >>> cache_prediction(report)  # doctest: +SKIP
        'The dataset (545 MB) fits in available memory (22 GB): epoch 1 reads it from disk ...'
    """
    storage = report.get("storage")
    if not storage:
        return None
    mem = report["memory"]
    room = int(mem["available_bytes"])
    if limit := mem.get("cgroup_limit_bytes"):
        room = min(room, int(limit))
    size = int(storage["dataset_bytes"])
    now = (f"{fmt_pct(storage['resident_frac'])} of it is in the page cache now"
           if storage.get("resident_frac") is not None else "")
    head = f"The dataset ({fmt_bytes(size)}) "
    if size <= TIGHT_FIT_FRAC * room:
        return (head + f"fits in available memory ({fmt_bytes(room)}): epoch 1 (train and "
                "validation) reads it from disk once, after that the page cache serves it and "
                f"the disk goes quiet{'; ' + now if now else ''}.")
    if size <= room:
        return (head + f"takes {fmt_pct(size / room)} of available memory ({fmt_bytes(room)}): "
                "it fits only if training leaves room, so later epochs may still read part of it "
                f"from disk{'; ' + now if now else ''}.")
    miss = 1.0 - room / size
    return (head + f"is larger than available memory ({fmt_bytes(room)}): every epoch reads "
            f"about {fmt_pct(miss)} of it ({fmt_bytes(miss * size)}) from disk again; the disk "
            "never goes quiet.")


def caveats(report: DoctorReport) -> list[str]:
    """Short warnings about how far the figures can be trusted on this machine."""
    out: list[str] = []
    cpu = report["cpu"]
    if float(cpu.get("load_avg_1m", 0.0)) > cpu["usable_cores"]:
        out.append(f"the machine was busy (load {cpu['load_avg_1m']:.1f} on "
                   f"{cpu['usable_cores']} cores): figures are lower than on a quiet machine")
    for key, c in measured_ceilings(report["ceilings"]):
        if c["min_images_per_s"] > 0 and c["images_per_s"] / c["min_images_per_s"] > NOISY_SPREAD:
            out.append(f"{key}: batches ranged {fmt_rate(c['min_images_per_s'])}–"
                       f"{fmt_rate(c['max_images_per_s'])} img/s; other work disturbed the timing")
    gpu = report["gpu"]
    if gpu.get("nvml") and gpu.get("devices") and not gpu.get("torch_cuda_available"):
        out.append("NVML sees a GPU but PyTorch does not (a CPU-only torch build?): training "
                   "would run on the CPU")
    if report["training"].get("device") == "cpu" and not cpu.get("bf16_native"):
        out.append("no native bf16 on this CPU (AVX512-BF16 or AMX): bf16 autocast would be "
                   "slower than fp32, so it was not measured")
    return out
