"""train.ceilings: decode and forward rates, with real files and a real (small) model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cv2
import pytest
import torch

from stepscope.errors import DataError
from stepscope.train.ceilings import (
    Ceiling,
    decode_ceiling,
    forward_ceiling,
    summarize,
    time_batches,
)
from stepscope.train.synth import synth_dataset

TINY_MODEL = "mobilenetv2_050"


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("synth")
    return sorted(synth_dataset(out, images=10, seed=0).images_dir.glob("*.jpg"))


def test_summarize_median_and_spread() -> None:
    c = summarize("x", [0.5, 0.1, 0.2, 0.2], batch_size=8, warmup_s=0.3, threads=2, includes="i")
    assert c.images_per_s == pytest.approx(40.0)
    assert (c.min_images_per_s, c.max_images_per_s) == (pytest.approx(16.0), pytest.approx(80.0))
    assert c.batches == 4 and c.seconds == pytest.approx(1.0) and c.warmup_s == 0.3
    assert c.to_dict()["includes"] == "i"
    with pytest.raises(ValueError):
        summarize("x", [], batch_size=8, warmup_s=0.0, threads=1, includes="")


def _ticking(step_s: float) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step_s


def test_time_batches_respects_budget_and_minimum() -> None:
    calls: list[int] = []
    ticks = _ticking(0.25)  # every clock read advances 0.25 s: each batch "takes" 0.25 s
    times, warm = time_batches(lambda: calls.append(1), seconds=1.0, min_batches=2,
                               warmup_batches=1, clock=lambda: next(ticks))
    assert warm == 0.25 and times == [0.25] * 4 and len(calls) == 5
    ticks = _ticking(5.0)  # a slow batch: the minimum count still runs
    times, _ = time_batches(lambda: None, seconds=1.0, min_batches=3, clock=lambda: next(ticks))
    assert times == [5.0] * 3


@pytest.mark.parametrize(("augment", "backend"), [(None, "fused"), ("seed", "fused"),
                                                  ("seed", "keras")])
def test_decode_ceiling(jpegs: list[Path], augment: str | None, backend: str) -> None:
    before = cv2.getNumThreads()
    c = decode_ceiling(jpegs, seconds=0.2, img_size=128, augment=augment,
                       backend=backend, batch_size=4)  # type: ignore[arg-type]
    assert isinstance(c, Ceiling)
    assert c.threads == 1 and c.batch_size == 4 and c.batches >= 2
    assert 0 < c.min_images_per_s <= c.images_per_s <= c.max_images_per_s
    assert ("augment" in c.name) == (augment is not None) and backend in c.name
    assert cv2.getNumThreads() == before  # the one-thread setting does not leak


def test_augmentation_costs_time(jpegs: list[Path]) -> None:
    plain = decode_ceiling(jpegs, seconds=0.3, img_size=224, augment=None, backend="keras")
    keras = decode_ceiling(jpegs, seconds=0.3, img_size=224, augment="seed", backend="keras")
    # SciPy's per-channel float resampling is several times the cost of decoding alone
    assert keras.images_per_s < plain.images_per_s


def test_decode_ceiling_without_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no image files"):
        decode_ceiling([], seconds=0.1, img_size=64, augment=None)
    with pytest.raises(DataError, match="could be read"):
        decode_ceiling([tmp_path / "missing.jpg"], seconds=0.1, img_size=64, augment=None)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_forward_ceiling(precision: str) -> None:
    threads_before = torch.get_num_threads()
    c = forward_ceiling(TINY_MODEL, img_size=64, batch_size=4, device="cpu",
                        precision=precision, channels_last=True, seconds=0.2,  # type: ignore[arg-type]
                        threads=1)
    assert c.threads == 1 and c.batches >= 2 and c.images_per_s > 0
    assert TINY_MODEL in c.name and precision in c.name and "channels_last" in c.name
    assert "no_grad" in c.includes
    assert torch.get_num_threads() == threads_before


def test_forward_ceiling_accepts_a_built_model() -> None:
    from stepscope.train.models import create_model

    model = create_model(TINY_MODEL, weights="none")
    c = forward_ceiling(model, img_size=64, batch_size=2, device=torch.device("cpu"),
                        precision="fp32", channels_last=False, seconds=0.1, min_batches=3,
                        threads=1)
    assert c.batches >= 3 and "channels_last" not in c.name
