"""Builds what a training run needs from a :class:`TrainConfig`: device, data, loaders, model."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from stepscope import policy
from stepscope.errors import StepscopeError
from stepscope.observe.host import cpu_quota_cores
from stepscope.train import augment, data, gpuaug, models, precision
from stepscope.train.config import TrainConfig


@dataclass
class Setup:
    """Everything the loop iterates over."""

    device: torch.device
    split: data.DatasetSplit
    train_loader: DataLoader[Any]
    val_loader: DataLoader[Any] | None
    model: models.TransferModel
    workers: int
    bf16: bool
    threads: int
    channels_last: bool
    # --aug-backend gpu: the batched warp the loop applies after the copy (train phase only).
    gpu_aug: gpuaug.GpuAugment | None = None
    # CUDA: copy batch i+1 on a side stream while batch i computes (cfg.device_prefetch).
    device_prefetch: bool = False
    # Under torchrun: the DistributedDataParallel wrapper the train phase calls (distributed.py).
    ddp: torch.nn.Module | None = None
    # One image as the loader yields it (C, H, W): a DDP rank whose first batch was all
    # unreadable has no batch to copy the shape from, yet must join the step's all-reduce.
    image_shape: tuple[int, int, int] | None = None


def usable_cores() -> int:
    """Cores this job may use: its affinity mask capped by its cgroup CPU quota."""
    return policy.job_cores(len(os.sched_getaffinity(0)), cpu_quota_cores())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise StepscopeError(
            f"--device {name} asked for, but PyTorch sees no CUDA GPU here "
            "(torch.cuda.is_available() is False): use --device cpu or auto"
        )
    return torch.device(name)


def resolve_workers(spec: str, *, cores: int, device: torch.device, backend: str) -> int:
    """``--workers auto``: :func:`stepscope.policy.auto_workers` (the rule doctor and the
    findings also follow) with the typical CPU trunk's need for ``backend``.

    On a CPU-only machine every worker takes cores from the trunk's own threads, so a cheap
    pipeline loads inline; on a GPU the trunk outruns any CPU pipeline, so the loader gets
    every core but one (the main process launches the GPU work).
    """
    if spec != "auto":
        return int(spec)
    if device.type == "cuda":
        return policy.auto_workers(None, cores, on_gpu=True)
    return policy.auto_workers(policy.default_loader_cores(backend), cores, on_gpu=False)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _single_threaded_opencv() -> None:
    """One OpenCV thread per process, set in the main process before workers fork.

    OpenCV's own thread pool in every worker would fight the trunk's threads on a small
    machine; one image at a time per worker is the efficient split. It must be set here, not
    in the worker: a forked child inherits the parent's pool state without its threads, and
    calling ``cv2.setNumThreads`` there waits forever on them.
    """
    import cv2

    cv2.setNumThreads(1)


def build_loaders(
    cfg: TrainConfig, split: data.DatasetSplit, device: torch.device, workers: int
) -> tuple[DataLoader[Any], DataLoader[Any] | None]:
    aug = augment.resolve_augment(cfg.augment)
    backend: augment.Backend = "keras" if cfg.aug_backend == "keras" else "fused"
    # gpu: the workers only decode and resize; the augmentation runs on the device (gpuaug).
    train_tf = augment.create_transform(
        None if cfg.aug_backend == "gpu" else aug, cfg.img_size, train=True, backend=backend,
        seed=cfg.seed,
    )
    val_tf = augment.create_transform(None, cfg.img_size, train=False, backend=backend)
    # free-form: DataLoader keyword arguments handed on
    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "num_workers": workers,
        "collate_fn": data.collate_skip_bad,
        # Pinned host memory lets the copy to the GPU run asynchronously (non_blocking).
        "pin_memory": device.type == "cuda",
    }
    if workers > 0:
        common.update(prefetch_factor=cfg.prefetch)
    gen = torch.Generator().manual_seed(cfg.seed)
    train_loader = DataLoader(
        data.ImageDataset(split.train, train_tf), shuffle=True, generator=gen, **common
    )
    val_loader = (
        DataLoader(data.ImageDataset(split.val, val_tf), shuffle=False, **common)
        if split.val else None
    )
    return train_loader, val_loader


def build(cfg: TrainConfig) -> Setup:
    """Resolve data, device, workers and model for ``cfg``."""
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    cores = usable_cores()
    threads = cfg.threads or cores
    if device.type == "cpu":
        torch.set_num_threads(threads)
    # Set before the loaders' workers fork: they inherit the limit.
    data.set_max_image_pixels(cfg.max_image_pixels)
    split = data.resolve_dataset(
        csv=Path(cfg.csv) if cfg.csv else None,
        val_csv=Path(cfg.val_csv) if cfg.val_csv else None,
        images=Path(cfg.images) if cfg.images else None,
        x_col=cfg.x_col, y_col=cfg.y_col,
        folder=Path(cfg.folder) if cfg.folder else None,
        val_split=cfg.val_split, seed=cfg.seed,
        on_missing="skip" if cfg.on_missing == "skip" else "error",
        follow_links=cfg.follow_links,
    )
    workers = resolve_workers(cfg.workers, cores=cores, device=device, backend=cfg.aug_backend)
    _single_threaded_opencv()
    train_loader, val_loader = build_loaders(cfg, split, device, workers)
    model = models.create_model(
        cfg.model, weights=cfg.weights, num_classes=len(split.classes), unfreeze=cfg.unfreeze
    )
    bf16 = policy.use_bf16(cfg.precision, precision.bf16_pays(device))
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model = model.to(device)
    s = Setup(
        device, split, train_loader, val_loader, model, workers, bf16, threads, cfg.channels_last,
        image_shape=(3, cfg.img_size, cfg.img_size),
    )
    aug = augment.resolve_augment(cfg.augment)
    if cfg.aug_backend == "gpu" and aug is not None:
        s.gpu_aug = gpuaug.GpuAugment(aug, seed=cfg.seed)
    s.device_prefetch = device.type == "cuda" and cfg.device_prefetch
    return s
