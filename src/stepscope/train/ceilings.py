"""Speed ceilings, measured in seconds: how fast one core feeds images, how fast the trunk eats them.

Two numbers decide, before any training, which side of a step will wait for the other:

- :func:`decode_ceiling`: images per second ONE core turns files into training tensors (read
  from the page cache, JPEG decode, resize, and optionally the augmentation), exactly the work
  one DataLoader worker does per image;
- :func:`forward_ceiling`: images per second the frozen trunk's forward pass runs on a device,
  the work the training step does per image (the head's share is negligible).

Both time whole batches and report the median batch, so one batch hit by another process's
burst does not move the figure, plus the spread, so a noisy machine shows as a wide one.
``stepscope doctor`` prints them; ``stepscope tune`` reuses them.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, cast

import cv2
import torch

from stepscope.errors import DataError
from stepscope.reports import CeilingRow
from stepscope.train import augment as augment_mod
from stepscope.train.models import TransferModel, create_model
from stepscope.train.precision import autocast_context

Precision = Literal["fp32", "bf16"]
Clock = Callable[[], float]


@dataclass(frozen=True)
class Ceiling:
    """A measured rate.

    Attributes:
        name: what was measured, e.g. ``"forward efficientnet_lite0 bf16"``.
        images_per_s: median over the timed batches.
        min_images_per_s: slowest timed batch.
        max_images_per_s: fastest timed batch.
        batches: timed batches (warm-up batches excluded).
        batch_size: images per batch.
        seconds: time spent in the timed batches.
        warmup_s: time of the untimed warm-up batch(es) (oneDNN/cuDNN pick kernels there).
        threads: threads the work ran on (1 for decoding: it is a per-core figure).
        includes: what one image's time includes, in words.
    """

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

    def to_dict(self) -> CeilingRow:
        return cast("CeilingRow", asdict(self))  # its fields, one for one (reports.py)


def summarize(name: str, batch_seconds: Sequence[float], *, batch_size: int, warmup_s: float,
              threads: int, includes: str) -> Ceiling:
    """Turn per-batch times into a :class:`Ceiling` (median rate, min/max spread).

    Examples:
        >>> c = summarize("x", [0.1, 0.2, 0.1], batch_size=8, warmup_s=0.0, threads=1, includes="")
        >>> c.images_per_s, c.min_images_per_s, c.max_images_per_s
        (80.0, 40.0, 80.0)
    """
    if not batch_seconds:
        raise ValueError("no timed batch: nothing to summarise")
    rates = [batch_size / max(s, 1e-9) for s in batch_seconds]
    return Ceiling(name, float(statistics.median(rates)), min(rates), max(rates),
                   len(rates), batch_size, float(sum(batch_seconds)), warmup_s, threads, includes)


def time_batches(run_batch: Callable[[], None], *, seconds: float, min_batches: int = 2,
                 warmup_batches: int = 1, clock: Clock = time.perf_counter
                 ) -> tuple[list[float], float]:
    """Run ``run_batch`` ``warmup_batches`` times untimed, then timed until ``seconds`` have
    passed and at least ``min_batches`` ran. Returns (per-batch seconds, warm-up seconds).

    Examples:
        >>> times, warm = time_batches(lambda: None, seconds=0.0, min_batches=3)
        >>> len(times)
        3
    """
    t0 = clock()
    for _ in range(warmup_batches):
        run_batch()
    warmup_s = clock() - t0
    times: list[float] = []
    spent = 0.0
    while spent < seconds or len(times) < min_batches:
        t0 = clock()
        run_batch()
        times.append(clock() - t0)
        spent += times[-1]
    return times, warmup_s


# --------------------------------------------------------------------------- decode


@contextlib.contextmanager
def _one_cv2_thread() -> Iterator[None]:
    # OpenCV parallelises resize/warp over its own thread pool; a per-core figure must keep it
    # to one thread, as each DataLoader worker does (augment.ImageTransform.rng).
    before = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(before)


def decode_ceiling(
    files: Sequence[Path], *, seconds: float, img_size: int, augment: str | None,
    backend: augment_mod.Backend = "fused", batch_size: int = 8, seed: int = 0,
    clock: Clock = time.perf_counter,
) -> Ceiling:
    """Images per second ONE core turns ``files`` into uint8 tensors at ``img_size``.

    The files are read once first, so the figure is decode + resize (+ augmentation) with the
    file in the page cache: disk speed is measured separately (``observe.machine.read_speed``).

    Args:
        files: sample image files (cycled if fewer than needed).
        seconds: time budget for the timed batches.
        img_size: output side in pixels.
        augment: ``"seed"``, ``"none"``/None, or a YAML file (``augment.resolve_augment``).
        backend: ``"fused"`` (one OpenCV warp) or ``"keras"`` (the SciPy reference).
        batch_size: images per timed batch.
        seed: augmentation RNG seed.
        clock: injectable clock.

    Raises:
        DataError: no files, or none decodable.

    Examples:
        >>> decode_ceiling(files, seconds=1.0, img_size=299, augment="seed")  # doctest: +SKIP
        Ceiling(name='decode+seed augment (fused) 299 px', images_per_s=1385.2, ...)
    """
    if not files:
        raise DataError("decode ceiling: no image files to decode; give a folder with JPEGs")
    params = augment_mod.resolve_augment(augment or "none")
    transform = augment_mod.create_transform(params, img_size, train=params is not None,
                                             backend=backend, seed=seed)
    good = [p for p in files if _readable(p)]
    if not good:
        raise DataError(f"decode ceiling: none of the {len(files)} sample files could be read")
    cursor = [0]

    def run_batch() -> None:
        for _ in range(batch_size):
            transform(good[cursor[0] % len(good)])
            cursor[0] += 1

    with _one_cv2_thread():
        times, warmup_s = time_batches(run_batch, seconds=seconds, clock=clock)
    what = "decode + resize" if params is None else f"decode + {_aug_name(augment)} augment"
    return summarize(
        f"{what} ({backend}) {img_size} px", times, batch_size=batch_size, warmup_s=warmup_s,
        threads=1,
        includes=f"read from page cache, JPEG decode (Pillow), {_resize_words(backend, params)}, "
        "uint8 CHW tensor; one thread",
    )


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()  # also puts it in the page cache: the disk is timed elsewhere
        return True
    except OSError:
        return False


def _aug_name(spec: str | None) -> str:
    return "seed" if spec in ("seed", None) else Path(str(spec)).name


def _resize_words(backend: str, params: augment_mod.AugmentParams | None) -> str:
    if params is None:
        return "resize (Pillow nearest)" if backend == "keras" else "resize (OpenCV bilinear)"
    if backend == "keras":
        return "nearest resize + SciPy affine per channel in float32 + flip + PIL brightness"
    return "one fused OpenCV affine warp (resize, rotation, shift, shear, zoom, flip) + brightness LUT"


# --------------------------------------------------------------------------- forward


def forward_ceiling(
    model: str | TransferModel, *, img_size: int, batch_size: int, device: torch.device | str,
    precision: Precision, channels_last: bool, seconds: float, threads: int | None = None,
    min_batches: int = 2, clock: Clock = time.perf_counter,
) -> Ceiling:
    """Images per second of the frozen trunk's forward pass (normalise + trunk + pooling).

    A model name is built with ``weights="none"``: speed does not depend on weight values, and
    no network is needed. A model passed in is moved to ``device`` and, with ``channels_last``,
    converted in place.

    Args:
        model: timm model name or a :class:`TransferModel`.
        img_size: input side in pixels.
        batch_size: images per batch.
        device: where to run.
        precision: ``"fp32"`` or ``"bf16"`` (autocast, as the trainer runs it).
        channels_last: NHWC weights and input, as the trainer's default.
        seconds: time budget for the timed batches.
        threads: torch CPU threads for the measurement (None: leave as set); restored after.
        min_batches: at least this many timed batches, whatever the budget.
        clock: injectable clock.

    Examples:
        >>> forward_ceiling("efficientnet_lite0", img_size=299, batch_size=8, device="cpu",
        ...                 precision="bf16", channels_last=True, seconds=2.0)  # doctest: +SKIP
        Ceiling(name='forward efficientnet_lite0 bf16 channels_last cpu 299 px', ...)
    """
    dev = torch.device(device)
    net = create_model(model, weights="none") if isinstance(model, str) else model
    net = net.to(dev).eval()
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    x = torch.randint(0, 256, (batch_size, 3, img_size, img_size), dtype=torch.uint8, device=dev)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def run_batch() -> None:
        with torch.no_grad(), autocast_context(dev, precision == "bf16"):
            net.features(net.normalize(x))
        if dev.type == "cuda":
            # CUDA runs asynchronously: without waiting here the clock would time the launch,
            # not the work. One sync per batch is the price of a benchmark, not of training.
            torch.cuda.synchronize(dev)

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used = torch.get_num_threads() if dev.type == "cpu" else 1
        times, warmup_s = time_batches(run_batch, seconds=seconds, min_batches=min_batches,
                                       clock=clock)
    finally:
        torch.set_num_threads(before)
    layout = " channels_last" if channels_last else ""
    where = f"{used} CPU thread(s)" if dev.type == "cpu" else f"{dev}, input already on the device"
    return summarize(
        f"forward {net.model_name} {precision}{layout} {dev.type} {img_size} px", times,
        batch_size=batch_size, warmup_s=warmup_s, threads=used,
        includes=f"uint8→float normalise + frozen trunk forward + pooling under no_grad, "
        f"{precision}; {where}; weights random (speed does not depend on them)",
    )
