"""A synthetic cats-vs-dogs dataset in the seed's layout, made offline in seconds.

The point is realistic *machine* behaviour (JPEGs of Dogs-vs-Cats sizes, 300–500 px a side, tens
of KB each, read through the page cache, decoded, augmented) with a task that is learnable but
not trivially so. The class lives in shape and texture, which survive rotation, shifts, zoom,
flips and brightness changes and which ImageNet features pick up readily:

- `cat`: ellipses and circles filled with stripes;
- `dog`: squares, rotated rectangles and triangles filled with a checkerboard or spots.

Colours, backgrounds, noise, stripe/check periods and shape sizes are drawn from the same
distributions for both classes, so neither mean colour nor JPEG file size gives the class away.

Layout (what `resolve_dataset(csv=..., val_csv=..., images=...)` reads):
    OUT/images/cat.0.jpg ...  OUT/train.csv  OUT/valid.csv   (columns Photo,Class; 80/20 split)

Examples:
    >>> summary = synth_dataset(Path("data/synth"), images=2000, seed=0)   # doctest: +SKIP
    >>> summary.train_images, summary.val_images                            # doctest: +SKIP
    (1600, 400)
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from stepscope.errors import DataError

CLASSES = ("cat", "dog")
JPEG_QUALITY = 90
VAL_FRAC = 0.2
_NOISE_TILE = 640  # side of the precomputed noise tile (> the largest image side)


@dataclass(frozen=True)
class SynthSummary:
    """What `synth_dataset` wrote."""

    out: Path
    images_dir: Path
    train_csv: Path
    val_csv: Path
    files: int
    bytes: int
    train_images: int
    val_images: int


def synth_dataset(
    out: Path,
    images: int = 2000,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> SynthSummary:
    """Write `images` JPEGs (half cats, half dogs) and the train/valid CSVs under `out`.

    Deterministic: the same `seed` writes the same bytes (each image has its own RNG stream,
    derived from (seed, index)). Existing files of the same names are overwritten.

    Args:
        out: output folder (created).
        images: number of images, at least 10 (5 per class, so both splits hold both classes).
        seed: dataset seed.
        progress: called as progress(done, total) after each image.

    Raises:
        DataError: too few images, or `out` exists and is not a folder.
    """
    if images < 10:
        raise DataError(f"--images {images}: expected at least 10 (5 per class).")
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} exists and is not a folder; choose another output path.")
    image_dir = out / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    noise = _noise_tile(seed)
    names: list[tuple[str, str]] = []
    total_bytes = 0
    for index in range(images):
        label = CLASSES[index % 2]
        name = f"{label}.{index // 2}.jpg"
        rng = np.random.default_rng([seed, index])
        data = encode_jpeg(render_image(rng, label, noise))
        (image_dir / name).write_bytes(data)
        total_bytes += len(data)
        names.append((name, label))
        if progress is not None:
            progress(index + 1, images)
    train, val = _split(names, seed)
    train_csv, val_csv = out / "train.csv", out / "valid.csv"
    _write_csv(train_csv, train)
    _write_csv(val_csv, val)
    return SynthSummary(
        out, image_dir, train_csv, val_csv, images, total_bytes, len(train), len(val)
    )


def _split(
    names: list[tuple[str, str]], seed: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Stratified 80/20: the same share of each class goes to validation."""
    rng = np.random.default_rng([seed, 1 << 30])
    train: list[tuple[str, str]] = []
    val: list[tuple[str, str]] = []
    for label in CLASSES:
        rows = [r for r in names if r[1] == label]
        order = rng.permutation(len(rows))
        n_val = round(len(rows) * VAL_FRAC)
        val_set = set(order[:n_val].tolist())
        train += [r for i, r in enumerate(rows) if i not in val_set]
        val += [r for i, r in enumerate(rows) if i in val_set]
    return train, val


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["Photo", "Class"])
        writer.writerows(rows)


def encode_jpeg(rgb: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """RGB uint8 → JPEG bytes (OpenCV/libjpeg-turbo, baseline, 4:2:0, deterministic)."""
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:  # pragma: no cover - OpenCV only fails on invalid arrays
        raise DataError("OpenCV could not encode a synthetic image as JPEG")
    return bytes(buf.tobytes())


# --------------------------------------------------------------------------- rendering


def _noise_tile(seed: int) -> np.ndarray:
    """Gaussian sensor-like noise, made once and cropped per image (drawing fresh noise for
    every pixel of every image would cost more than the rest of the rendering)."""
    rng = np.random.default_rng([seed, 1 << 31])
    return rng.standard_normal((_NOISE_TILE, _NOISE_TILE, 3), dtype=np.float32)


def render_image(rng: np.random.Generator, label: str, noise: np.ndarray) -> np.ndarray:
    """One RGB uint8 image of class `label` (300–500 px a side)."""
    h, w = (int(v) for v in rng.integers(300, 501, size=2))
    img = _background(rng, h, w)
    for _ in range(int(rng.integers(3, 6))):
        _draw_shape(img, rng, label)
    y0, x0 = (int(v) for v in rng.integers(0, _NOISE_TILE - 500, size=2))
    img += noise[y0 : y0 + h, x0 : x0 + w] * np.float32(rng.uniform(1.0, 4.5))
    return np.clip(img, 0, 255).astype(np.uint8)


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth float32 background: a 2×2 colour grid (a bilinear gradient) or a 3–4 a side
    grid of colour blobs, upsampled (cheap: the whole image is one cv2.resize)."""
    side = 2 if rng.random() < 0.5 else int(rng.integers(3, 5))
    grid = rng.uniform(0, 255, (side, side, 3)).astype(np.float32)
    mode = cv2.INTER_LINEAR if side == 2 else cv2.INTER_CUBIC
    return np.asarray(cv2.resize(grid, (w, h), interpolation=mode), dtype=np.float32)


def _draw_shape(img: np.ndarray, rng: np.random.Generator, label: str) -> None:
    """Composite one textured shape into `img` (in place), within its bounding box only."""
    h, w = img.shape[:2]
    size = int(rng.uniform(0.12, 0.3) * min(h, w))
    cy, cx = int(rng.integers(size, h - size)), int(rng.integers(size, w - size))
    box = (slice(cy - size, cy + size), slice(cx - size, cx + size))
    mask = np.zeros((2 * size, 2 * size), np.uint8)
    angle = float(rng.uniform(0, 180))
    if label == "cat":
        axes = (size - 2, int((size - 2) * rng.uniform(0.55, 1.0)))
        cv2.ellipse(mask, (size, size), axes, angle, 0, 360, 255, -1, cv2.LINE_AA)
    else:
        cv2.fillPoly(mask, [_polygon(rng, size, angle)], 255, cv2.LINE_AA)
    tex = _texture(rng, 2 * size, label)
    c0, c1 = rng.uniform(0, 255, 3).astype(np.float32), rng.uniform(0, 255, 3).astype(np.float32)
    fill = c0 + (c1 - c0) * tex[..., None]
    alpha = (mask.astype(np.float32) / 255.0)[..., None]
    img[box] = img[box] * (1 - alpha) + fill * alpha


def _polygon(rng: np.random.Generator, size: int, angle_deg: float) -> np.ndarray:
    """A square, a rectangle or a triangle centred in a (2·size)² box, rotated."""
    kind = int(rng.integers(0, 3))
    r = size - 2
    if kind == 2:
        pts = [(r * np.cos(a), r * np.sin(a)) for a in np.deg2rad([90, 210, 330])]
    else:
        aspect = 1.0 if kind == 0 else float(rng.uniform(0.5, 0.9))
        hx, hy = r / np.sqrt(2), r / np.sqrt(2) * aspect
        pts = [(-hx, -hy), (hx, -hy), (hx, hy), (-hx, hy)]
    t = np.deg2rad(angle_deg)
    rot = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    xy = np.array(pts) @ rot.T + size
    return np.round(xy).astype(np.int32)


def _texture(rng: np.random.Generator, side: int, label: str) -> np.ndarray:
    """A 0..1 float32 pattern: stripes (cat) or checks/spots (dog), same period distribution."""
    period = float(rng.uniform(7.0, 18.0))
    t = np.deg2rad(float(rng.uniform(0, 180)))
    k = np.float32(2 * np.pi / period)
    xs = np.arange(side, dtype=np.float32)[None, :] * k
    ys = np.arange(side, dtype=np.float32)[:, None] * k
    u = xs * np.float32(np.cos(t)) + ys * np.float32(np.sin(t))
    if label == "cat":
        wave = np.sin(u)
    else:
        v = ys * np.float32(np.cos(t)) - xs * np.float32(np.sin(t))
        checker = rng.random() < 0.5
        # A checkerboard, or spots on a lattice.
        wave = np.sin(u) * np.sin(v) if checker else np.cos(u) + np.cos(v) - 1.0
    # A soft square wave: sharp enough to read as a pattern, smooth enough to compress sanely.
    return np.clip(0.5 + 1.5 * wave, 0.0, 1.0).astype(np.float32, copy=False)
