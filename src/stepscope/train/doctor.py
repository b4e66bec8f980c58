"""``stepscope doctor``: what this machine is, what stepscope can measure on it, and two measured
speeds (one core's decoding, the trunk's forward pass) that predict the bottleneck before training.

:func:`run_doctor` returns plain JSON-ready data; ``analysis.doctor.prediction`` turns it into the
verdict and ``render.doctor.doctor_view`` shows it.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import cast

import torch

from stepscope.errors import DataError
from stepscope.observe import machine
from stepscope.observe.pagecache import DatasetResidency
from stepscope.reports import (
    CeilingRow,
    Ceilings,
    CpuReport,
    DoctorReport,
    GpuReport,
    MemoryReport,
    ReadSpeedRow,
    StorageReport,
)
from stepscope.train import ceilings, precision
from stepscope.train.augment import Backend
from stepscope.train.data import IMAGE_SUFFIXES
from stepscope.train.models import check_model_name, create_model
from stepscope.train.synth import synth_dataset

SCHEMA_VERSION = 1
DECODE_SAMPLE_FILES = 32  # enough distinct JPEGs that one odd file does not set the figure
# Shares of ``budget_s`` per timed measurement. They leave a quarter for what cannot be
# budgeted (building the model, the warm-up batch in which oneDNN picks its kernels, the
# probes), so the whole run takes about ``budget_s``.
_BUDGET_SHARES = {"read": 0.05, "decode": 0.1, "decode_augment": 0.1, "forward": 0.5}


def run_doctor(
    *,
    data: Path | None,
    model: str = "efficientnet_lite0",
    img_size: int = 299,
    batch_size: int = 8,
    budget_s: float = 10.0,
    progress: Callable[[str], None] | None = None,
    augment: str = "seed",
    aug_backend: Backend = "fused",
    threads: int | None = None,
) -> DoctorReport:
    """Probe the machine and measure the two ceilings; returns the doctor's JSON report.

    Args:
        data: a dataset folder (searched recursively for images) for the storage section and
            for decoding real files; None synthesises 32 JPEGs in a temporary folder.
        model: timm model name, measured with random weights (no network needed).
        img_size: training image size in pixels.
        batch_size: training batch size.
        budget_s: roughly how long the whole run takes (three quarters of it timed batches).
        progress: called with a short line before each stage.
        augment: the augmentation training will use (``"seed"``, ``"none"`` or a YAML file).
        aug_backend: ``"fused"`` or ``"keras"``, as ``--aug-backend``.
        threads: torch CPU threads for the trunk (None: every usable core, as ``train`` does).

    Raises:
        DataError: ``data`` is not a folder or holds no images.
        ModelError: unknown model name.

    Examples:
        >>> report = run_doctor(data=None, budget_s=5.0)  # doctest: +SKIP
        >>> report["ceilings"]["forward_fp32"]["images_per_s"]  # doctest: +SKIP
        31.2
    """
    say = progress or (lambda _text: None)
    check_model_name(model)  # fail before spending seconds on probes
    t_start = time.perf_counter()
    say("reading CPU, memory and GPU facts")
    cpu, mem, gpu = machine.cpu_facts(), machine.memory_facts(), machine.gpu_facts()
    files = list_images(data) if data is not None else []
    storage = None
    if data is not None:
        say(f"timing a cold read of {data}")
        storage = storage_report(data, files, seconds=budget_s * _BUDGET_SHARES["read"])
    say("checking what can be measured here")
    caps = machine.capabilities(gpu, probe_file=files[0] if files else None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_threads = threads or cpu.usable_cores
    bf16_pays = precision.bf16_pays(device)
    ceilings_found = measure_ceilings(
        files, model=model, img_size=img_size, batch_size=batch_size, budget_s=budget_s,
        device=device, threads=train_threads, bf16=bf16_pays, augment=augment,
        aug_backend=aug_backend, say=say,
    )
    # The sections are the observe/machine.py dataclasses as dicts, field for field (reports.py;
    # tests/test_contracts.py checks the two agree).
    return {
        "schema_version": SCHEMA_VERSION,
        "cpu": cast("CpuReport", {**asdict(cpu), "bf16_native": precision.cpu_has_bf16()}),
        "memory": cast("MemoryReport", asdict(mem)),
        "gpu": cast("GpuReport", {**asdict(gpu), **torch_cuda_facts()}),
        "storage": storage,
        "capabilities": [c.to_dict() for c in caps],
        "training": {
            "device": device.type, "threads": train_threads if device.type == "cpu" else None,
            "model": model, "img_size": img_size, "batch_size": batch_size,
            "augment": augment, "aug_backend": aug_backend, "bf16_pays": bf16_pays,
            "precision": "bf16" if bf16_pays else "fp32", "channels_last": True,
        },
        "ceilings": ceilings_found,
        "elapsed_s": time.perf_counter() - t_start,
    }


def torch_cuda_facts() -> dict[str, bool | int | str | None]:
    """Whether PyTorch itself sees a GPU (it may not, though NVML does: a CPU-only wheel)."""
    available = torch.cuda.is_available()
    return {
        "torch_cuda_available": available,
        "torch_device_count": torch.cuda.device_count() if available else 0,
        "torch_cuda_version": torch.version.cuda,
    }


def list_images(folder: Path) -> list[Path]:
    """Every image file under ``folder`` (recursively), sorted.

    Raises:
        DataError: not a folder, or no images in it.
    """
    if not folder.is_dir():
        raise DataError(f"--data {folder}: not a folder; give the folder holding the images")
    found = [
        Path(root) / name
        for root, _dirs, names in os.walk(folder)
        for name in names
        if Path(name).suffix.lower() in IMAGE_SUFFIXES
    ]
    if not found:
        raise DataError(f"--data {folder}: no image files found under it (looked for "
                        f"{', '.join(sorted(IMAGE_SUFFIXES))})")
    return sorted(found)


def storage_report(data: Path, files: list[Path], *, seconds: float) -> StorageReport:
    """The filesystem and disk holding ``data``, the dataset's size and cache residency, and a
    cold read of sample files (which evicts them: the next read comes from the disk)."""
    sizes = [_size(p) for p in files]
    # Residency first: the cold read below evicts its sample and would lower the figure.
    residency = DatasetResidency(files)
    resident_frac = residency.resident_frac()
    speed = machine.read_speed(files, seconds=seconds)
    mount = machine.mount_facts(data)
    return {
        "path": str(data.resolve()),
        "fstype": mount.fstype, "mount_point": mount.mount_point, "source": mount.source,
        "block_device": mount.block_device, "rotational": mount.rotational,
        "files": len(files),
        "dataset_bytes": sum(sizes),
        "resident_frac": resident_frac,
        "resident_sampled_files": len(residency.sample_files),
        "read": None if speed is None else cast("ReadSpeedRow", asdict(speed)),
    }


def measure_ceilings(
    files: list[Path], *, model: str, img_size: int, batch_size: int, budget_s: float,
    device: torch.device, threads: int, bf16: bool, augment: str, aug_backend: Backend,
    say: Callable[[str], None],
) -> Ceilings:
    """Decode (plain and with ``augment``) and forward (fp32, and bf16 where it pays)."""
    with tempfile.TemporaryDirectory(prefix="stepscope-doctor-") as tmp:
        sample = _decode_sample(files, Path(tmp), say)
        say(f"timing JPEG decode on one core ({len(sample)} files)")
        share = budget_s * _BUDGET_SHARES["decode"]
        decode = ceilings.decode_ceiling(
            sample, seconds=share, img_size=img_size, augment=None, backend=aug_backend,
            batch_size=batch_size).to_dict()
        decode_augment = None
        if augment != "none":
            say(f"timing decode + {augment} augmentation on one core")
            decode_augment = ceilings.decode_ceiling(
                sample, seconds=budget_s * _BUDGET_SHARES["decode_augment"], img_size=img_size,
                augment=augment, backend=aug_backend, batch_size=batch_size).to_dict()
    net = create_model(model, weights="none")
    forward_s = budget_s * _BUDGET_SHARES["forward"] / (2 if bf16 else 1)
    forward: dict[str, CeilingRow] = {}
    for prec in ("fp32", "bf16") if bf16 else ("fp32",):
        say(f"timing the {model} trunk's forward pass, {prec}, on {device.type}")
        forward[prec] = ceilings.forward_ceiling(
            net, img_size=img_size, batch_size=batch_size, device=device, precision=prec,
            channels_last=True, seconds=forward_s, threads=threads).to_dict()
    return {"decode": decode, "decode_augment": decode_augment,
            "forward_fp32": forward["fp32"], "forward_bf16": forward.get("bf16")}


def _decode_sample(files: list[Path], tmp: Path, say: Callable[[str], None]) -> list[Path]:
    if files:
        if len(files) <= DECODE_SAMPLE_FILES:
            return files
        return random.Random(0).sample(files, DECODE_SAMPLE_FILES)
    say(f"no --data: synthesising {DECODE_SAMPLE_FILES} Dogs-vs-Cats-sized JPEGs to decode")
    return sorted(synth_dataset(tmp, images=DECODE_SAMPLE_FILES, seed=0).images_dir.glob("*.jpg"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
