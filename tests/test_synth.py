"""Synthetic dataset: the seed's layout, Dogs-vs-Cats-like files, deterministic, and a class
that lives in the content, not in the file size or the mean colour."""

from __future__ import annotations

import csv
import hashlib
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stepscope.errors import DataError
from stepscope.train.data import resolve_dataset
from stepscope.train.synth import SynthSummary, synth_dataset


@pytest.fixture(scope="module")
def synth200(tmp_path_factory: pytest.TempPathFactory) -> SynthSummary:
    return synth_dataset(tmp_path_factory.mktemp("synth") / "ds", images=200, seed=0)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def test_layout_and_split(synth200: SynthSummary) -> None:
    train, val = _rows(synth200.train_csv), _rows(synth200.val_csv)
    assert list(train[0]) == ["Photo", "Class"]
    assert (synth200.train_images, synth200.val_images) == (len(train), len(val)) == (160, 40)
    for rows, n in ((train, 80), (val, 20)):  # stratified: the same share of each class
        assert sum(r["Class"] == "cat" for r in rows) == n
        assert sum(r["Class"] == "dog" for r in rows) == n
    assert not {r["Photo"] for r in train} & {r["Photo"] for r in val}
    for row in train + val:
        assert row["Photo"].startswith(row["Class"] + ".") and row["Photo"].endswith(".jpg")
        assert (synth200.images_dir / row["Photo"]).is_file()
    split = resolve_dataset(
        csv=synth200.train_csv, val_csv=synth200.val_csv, images=synth200.images_dir
    )
    assert split.classes == ["cat", "dog"] and len(split.train) == 160


def test_files_look_like_dogs_vs_cats(synth200: SynthSummary) -> None:
    files = sorted(synth200.images_dir.glob("*.jpg"))
    assert synth200.files == len(files) == 200
    assert synth200.bytes == sum(p.stat().st_size for p in files)
    mean_kb = synth200.bytes / synth200.files / 1024
    assert 22 <= mean_kb <= 40, mean_kb
    for path in files[:40]:
        with Image.open(path) as img:
            assert img.format == "JPEG" and img.mode == "RGB"
            assert all(300 <= side <= 500 for side in img.size)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = synth_dataset(tmp_path / "a", images=12, seed=5)
    b = synth_dataset(tmp_path / "b", images=12, seed=5)
    c = synth_dataset(tmp_path / "c", images=12, seed=6)
    assert _digest(a.out) == _digest(b.out) != _digest(c.out)


def test_progress_and_too_few(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    synth_dataset(
        tmp_path / "p", images=10, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(i, 10) for i in range(1, 11)]
    with pytest.raises(DataError, match="at least 10"):
        synth_dataset(tmp_path / "q", images=4)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="not a folder"):
        synth_dataset(tmp_path / "file", images=10)


def test_speed_is_well_under_30_s_for_2000(tmp_path: Path) -> None:
    start = time.perf_counter()
    synth_dataset(tmp_path / "s", images=40)
    per_image_s = (time.perf_counter() - start) / 40
    # 2000 images must take well under 30 s on one core: 15 ms/image, with room for a busy CI.
    assert per_image_s < 0.03, per_image_s


# --------------------------------------------------------------------------- not a shortcut


def _features(summary: SynthSummary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    files = sorted(summary.images_dir.glob("*.jpg"))
    size = np.array([p.stat().st_size for p in files], dtype=np.float64)
    colour = np.array(
        [np.asarray(Image.open(p).reduce(4), dtype=np.float64).mean(axis=(0, 1)) for p in files]
    )
    label = np.array([p.name.startswith("dog") for p in files], dtype=np.float64)
    return size, colour, label


def _best_threshold_accuracy(x: np.ndarray, y: np.ndarray) -> float:
    """In-sample best single threshold, either direction: an optimistic bound for the feature."""
    order = np.argsort(x)
    ys = y[order]
    below_pos = np.concatenate([[0], np.cumsum(ys)])
    below_neg = np.arange(len(ys) + 1) - below_pos
    above_pos = ys.sum() - below_pos
    acc = (below_neg + above_pos) / len(ys)  # predict "dog" above the threshold
    return float(max(acc.max(), (1 - acc).max()))


def _logistic_accuracy(x: np.ndarray, y: np.ndarray, train: np.ndarray) -> float:
    """Logistic regression (gradient descent on standardised features), held-out accuracy."""
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-9
    z = np.c_[(x - mu) / sd, np.ones(len(x))]
    w = np.zeros(z.shape[1])
    for _ in range(2000):
        p = 1 / (1 + np.exp(-z[train] @ w))
        w -= 0.5 * z[train].T @ (p - y[train]) / train.sum()
    pred = (z[~train] @ w) > 0
    return float((pred == y[~train]).mean())


def test_class_not_given_away_by_file_size_or_mean_colour(synth200: SynthSummary) -> None:
    size, colour, label = _features(synth200)
    assert _best_threshold_accuracy(size, label) < 0.62
    for channel in range(3):
        assert _best_threshold_accuracy(colour[:, channel], label) < 0.62
    train = np.random.default_rng(0).random(len(label)) < 0.7
    assert _logistic_accuracy(np.c_[colour, np.log(size)], label, train) < 0.65
