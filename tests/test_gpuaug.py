"""The device-side augmentation (run here on the CPU) and the one-batch-ahead prefetcher."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from skimage import data as skdata

from stepscope.errors import DataError
from stepscope.train.augment import (
    IDENTITY,
    SEED_AUGMENT,
    AugmentParams,
    TransformDraw,
    apply_fused,
    draw_transform,
)
from stepscope.train.data import Batch
from stepscope.train.gpuaug import DevicePrefetcher, GpuAugment, to_device, warp_batch

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


SIZE = 96


@pytest.fixture(scope="module")
def cat() -> np.ndarray:
    """A real photo (HWC uint8) at SIZE x SIZE, as the CPU hands it over after the resize."""
    return np.asarray(cv2.resize(skdata.chelsea(), (SIZE, SIZE), interpolation=cv2.INTER_AREA))


def _chw(img: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


def _hwc(x: torch.Tensor) -> np.ndarray:
    return x.numpy().transpose(1, 2, 0)


def test_matches_the_fused_cpu_path_for_fixed_draws(cat: np.ndarray) -> None:
    rng = np.random.RandomState(0)
    draws = [draw_transform(SEED_AUGMENT, (SIZE, SIZE), rng) for _ in range(8)]
    batch = _chw(cat)[None].repeat(len(draws), 1, 1, 1)
    out = warp_batch(batch, draws)
    assert out.dtype == torch.uint8 and out.shape == batch.shape
    for d, got in zip(draws, out, strict=True):
        want = apply_fused(cat, d, (SIZE, SIZE))
        diff = np.abs(want.astype(int) - _hwc(got).astype(int))
        # OpenCV interpolates with 1/32-pixel fixed-point weights, grid_sample in float.
        assert diff.mean() < 0.25, d
        assert np.percentile(diff, 99.9) <= 3, d


def test_identity_and_pure_flip_are_exact(cat: np.ndarray) -> None:
    x = _chw(cat)[None]
    assert torch.equal(warp_batch(x, [IDENTITY]), x)
    flipped = warp_batch(x, [TransformDraw(flip_horizontal=True)])
    assert torch.equal(flipped, x.flip(-1))
    assert torch.equal(warp_batch(x, [TransformDraw(flip_vertical=True)]), x.flip(-2))


def test_brightness_truncates_like_pil() -> None:
    x = torch.full((4, 3, 8, 8), 101, dtype=torch.uint8)
    factors = [0.5, 0.77, 1.0, 1.5]
    out = warp_batch(x, [TransformDraw(brightness=b) for b in factors])
    for b, img in zip(factors, out, strict=True):
        assert int(img[0, 0, 0]) == min(255, math.floor(101 * np.float32(b)))


def _dot_image(row: int, col: int) -> torch.Tensor:
    x = torch.zeros((1, 3, SIZE, SIZE), dtype=torch.uint8)
    x[..., row - 1 : row + 2, col - 1 : col + 2] = 255
    return x


def _centroid(img: torch.Tensor) -> tuple[float, float]:
    w = img[0].double()
    rows, cols = torch.meshgrid(torch.arange(SIZE).double(), torch.arange(SIZE).double(),
                                indexing="ij")
    return float((w * rows).sum() / w.sum()), float((w * cols).sum() / w.sum())


def test_shifts_stay_within_the_shift_range() -> None:
    # fill 'constant': a dot shifted out of the frame disappears instead of smearing the edge.
    aug = GpuAugment(AugmentParams(width_shift_range=0.2, height_shift_range=0.2,
                                   fill_mode="constant"), seed=1)
    center = SIZE // 2
    for _ in range(40):
        out = aug(_dot_image(center, center))
        r, c = _centroid(out[0])
        assert abs(r - center) <= 0.2 * SIZE + 1 and abs(c - center) <= 0.2 * SIZE + 1


def test_rotations_stay_within_the_rotation_range() -> None:
    aug = GpuAugment(AugmentParams(rotation_range=30, fill_mode="constant"), seed=2)
    center = (SIZE - 1) / 2
    row, col = SIZE // 2, SIZE // 2 + 30  # a dot 30 px right of the centre
    angles = []
    for _ in range(40):
        r, c = _centroid(aug(_dot_image(row, col))[0])
        angles.append(math.degrees(math.atan2(r - center, c - center)))
        assert math.hypot(r - center, c - center) == pytest.approx(30.5, abs=1.5)
    assert max(abs(a) for a in angles) <= 30 + 2
    assert max(angles) > 10 and min(angles) < -10  # both directions occur


def test_flip_happens_about_half_the_time() -> None:
    aug = GpuAugment(AugmentParams(horizontal_flip=True), seed=3)
    draws = aug.draw(400, (SIZE, SIZE))
    assert 160 < sum(d.flip_horizontal for d in draws) < 240


def test_draws_are_the_seed_augmentation_stream() -> None:
    aug = GpuAugment(SEED_AUGMENT, seed=7)
    rng = np.random.RandomState(7)
    assert aug.draw(5, (299, 299)) == [draw_transform(SEED_AUGMENT, (299, 299), rng)
                                       for _ in range(5)]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_any_seed_draw_gives_a_valid_uint8_batch(seed: int) -> None:
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    out = GpuAugment(SEED_AUGMENT, seed=seed)(x)
    assert out.dtype == torch.uint8 and out.shape == x.shape


def test_rejects_wrap_and_non_uint8() -> None:
    with pytest.raises(DataError, match="wrap"):
        GpuAugment(AugmentParams(fill_mode="wrap"))
    with pytest.raises(TypeError, match="uint8"):
        GpuAugment(SEED_AUGMENT)(torch.zeros(1, 3, 8, 8))


def test_prefetcher_keeps_order_length_and_batch_type() -> None:
    batches = [Batch(torch.full((2, 3, 4, 4), i, dtype=torch.uint8), torch.tensor([i, i]),
                     [f"bad{i}"] if i == 1 else []) for i in range(5)]

    class Loader(list[Batch]):
        num_workers = 3

    pre = DevicePrefetcher(Loader(batches), torch.device("cpu"))
    assert len(pre) == 5 and pre.num_workers == 3
    got = list(pre)
    assert [int(b.labels[0]) for b in got] == [0, 1, 2, 3, 4]
    assert all(isinstance(b, Batch) for b in got) and got[1].bad_files == ["bad1"]
    assert list(DevicePrefetcher([], torch.device("cpu"))) == []


def test_to_device_walks_tuples_and_keeps_other_values() -> None:
    b = Batch(torch.zeros(1), torch.ones(1), ["x"])
    moved = to_device(b, torch.device("cpu"))
    assert isinstance(moved, Batch) and moved.bad_files == ["x"]
    assert to_device([torch.zeros(1), 3], torch.device("cpu"))[1] == 3
