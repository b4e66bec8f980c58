"""The device side of the input pipeline: batched augmentation after the copy, and copies issued
one batch ahead.

``--aug-backend gpu``: the DataLoader workers only decode and resize (uint8, the cheapest work a
CPU can do per image), and the seed's augmentation runs on the device, one batched warp for the
whole batch. Per image the parameters are drawn exactly as the CPU backends draw them
(:func:`stepscope.train.augment.draw_transform`, the same distributions and the same composed
matrix as the fused path, :func:`stepscope.train.augment.fused_matrix`); the warp is
``F.affine_grid`` + ``F.grid_sample(mode="bilinear")`` and brightness a per-image multiply with
PIL's truncation. A big GPU warps thousands of 299 px images per millisecond-scale kernel, so
the CPU is left with decoding only: the step that starves a GPU in the seed's pipeline.

Unlike the fused CPU path, which resamples once straight from the decoded source, this path
resamples twice (the CPU resize, then the warp), as Keras itself does; the difference is a
slight extra blur, not a different distribution.

:class:`DevicePrefetcher` issues the host-to-device copy of batch i+1 on a side CUDA stream
before batch i's compute is launched, so the copy overlaps compute instead of preceding it.

Examples:
    >>> aug = GpuAugment(SEED_AUGMENT, seed=0)                        # doctest: +SKIP
    >>> x = aug(torch.zeros(8, 3, 299, 299, dtype=torch.uint8))       # doctest: +SKIP
    >>> x.dtype, x.shape                                              # doctest: +SKIP
    (torch.uint8, torch.Size([8, 3, 299, 299]))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from stepscope.errors import DataError
from stepscope.train.augment import AugmentParams, TransformDraw, draw_transform, fused_matrix

# Keras fill modes and the grid_sample padding that reproduces each. 'border' clamps the
# sampling position to the edge, i.e. repeats the edge pixel: Keras's 'nearest'.
PADDING_MODES = {"nearest": "border", "constant": "zeros", "reflect": "reflection"}


def pixel_to_normalized(h: int, w: int) -> np.ndarray:
    """3×3 map from OpenCV pixel coordinates (x, y) to grid_sample's [-1, 1] coordinates.

    With ``align_corners=False`` the edges of the image, not the centres of its corner pixels,
    sit at ±1: u = (2x + 1) / w − 1.
    """
    return np.array([[2.0 / w, 0.0, 1.0 / w - 1.0], [0.0, 2.0 / h, 1.0 / h - 1.0], [0, 0, 1.0]])


def affine_theta(d: TransformDraw, hw: tuple[int, int]) -> np.ndarray:
    """The 2×3 ``F.affine_grid`` matrix of draw ``d`` on an image already at its output size.

    ``fused_matrix`` maps output pixels to source pixels (OpenCV coordinates, the resize being
    the identity here); conjugating it by the pixel→normalised map gives the same warp in
    grid_sample's coordinates.
    """
    m = np.vstack([fused_matrix(d, hw, hw), [0.0, 0.0, 1.0]])
    n = pixel_to_normalized(*hw)
    return (n @ m @ np.linalg.inv(n))[:2]


def warp_batch(x: Tensor, draws: Sequence[TransformDraw], fill_mode: str = "nearest") -> Tensor:
    """Warp a uint8 NCHW batch with one draw per image; returns uint8 NCHW on x's device.

    Rounds the warped values before brightness and truncates after it, as the fused path does
    (OpenCV's uint8 warp rounds; PIL's brightness truncates).
    """
    if len(draws) != len(x):
        raise ValueError(f"{len(draws)} draws for a batch of {len(x)} images")
    if fill_mode not in PADDING_MODES:
        raise DataError(_fill_mode_message(fill_mode))
    h, w = int(x.shape[-2]), int(x.shape[-1])
    theta = torch.as_tensor(np.stack([affine_theta(d, (h, w)) for d in draws]),
                            dtype=torch.float32).to(x.device, non_blocking=True)
    grid = F.affine_grid(theta, [len(x), x.shape[1], h, w], align_corners=False)
    y = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode=PADDING_MODES[fill_mode],
                      align_corners=False).round_()
    factors = [1.0 if d.brightness is None else d.brightness for d in draws]
    if any(f != 1.0 for f in factors):
        b = torch.tensor(factors, dtype=torch.float32).to(x.device, non_blocking=True)
        y = torch.floor(y * b.view(-1, 1, 1, 1))
    return y.clamp_(0, 255).to(torch.uint8)


def _fill_mode_message(fill_mode: str) -> str:
    return (f"fill_mode {fill_mode!r} has no grid_sample equivalent; --aug-backend gpu supports "
            f"{sorted(PADDING_MODES)}. Use --aug-backend fused for 'wrap'.")


class GpuAugment:
    """Batched seed-style augmentation on uint8 NCHW batches, on whatever device they are.

    Parameters are drawn in the main process from one legacy ``RandomState(seed)``, per image,
    in batch order: a few microseconds a batch, and the run is repeatable.

    Args:
        augment: the augmentation to apply (Keras's ImageDataGenerator settings).
        seed: seeds the parameter draws.
    """

    def __init__(self, augment: AugmentParams, *, seed: int | None = 0) -> None:
        if augment.fill_mode not in PADDING_MODES:
            raise DataError(_fill_mode_message(augment.fill_mode))
        self.augment = augment
        self.rng = np.random.RandomState(seed)

    def draw(self, n: int, hw: tuple[int, int]) -> list[TransformDraw]:
        """``n`` parameter draws for images of size ``hw`` (the next ones in the stream)."""
        return [draw_transform(self.augment, hw, self.rng) for _ in range(n)]

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype != torch.uint8 or x.dim() != 4:
            raise TypeError(f"GpuAugment expects a uint8 NCHW batch, got {x.dtype} {tuple(x.shape)}")
        draws = self.draw(len(x), (int(x.shape[-2]), int(x.shape[-1])))
        return warp_batch(x, draws, self.augment.fill_mode)


def to_device(batch: Any, device: torch.device) -> Any:
    """Copy every tensor of a (named) tuple or list batch to ``device``, non-blocking."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # NamedTuple, e.g. data.Batch
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class DevicePrefetcher:
    """Iterates ``loader`` one batch ahead, the next batch already on its way to ``device``.

    On CUDA the copy of batch i+1 is issued on a side stream before batch i is handed out, so
    it runs while batch i computes; the compute stream waits for that copy only when it uses
    the batch. The loader's batches must be in pinned memory for the copy to be asynchronous.
    On any other device it copies in line (useful for tests, pointless for speed).

    The loop then sees batches already on the device: its own ``.to(device)`` is a no-op and
    the step's recorded transfer time is ~0, because the copy overlapped compute.
    """

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.num_workers = getattr(loader, "num_workers", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        it = iter(self.loader)
        ahead = self._issue(next(it, None), stream)
        while ahead is not None:
            current = ahead
            if stream is not None:
                # The compute stream must not read the batch before its copy has landed.
                torch.cuda.current_stream(self.device).wait_stream(stream)
                _record_stream(current, torch.cuda.current_stream(self.device))
            ahead = self._issue(next(it, None), stream)
            yield current

    def _issue(self, batch: Any, stream: Any) -> Any:
        if batch is None or stream is None:
            return None if batch is None else to_device(batch, self.device)
        with torch.cuda.stream(stream):
            return to_device(batch, self.device)


def _record_stream(batch: Any, stream: Any) -> None:
    # Memory allocated on the side stream would be reused once that stream moves on; telling
    # the allocator the compute stream uses it keeps it alive until compute is done with it.
    if isinstance(batch, Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, tuple | list):
        for v in batch:
            _record_stream(v, stream)
