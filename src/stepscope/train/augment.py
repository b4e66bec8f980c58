"""Keras-ImageDataGenerator augmentation: a faithful reference and a fused fast path.

Every transform maps a file path to a **uint8 CHW tensor at the target size**. Conversion to
float and normalisation happen later, on the device: a uint8 image is a quarter of the bytes a
float32 one is, and those bytes cross from DataLoader workers through shared memory and then the
PCIe bus.

Two backends draw the *same* random parameters from the *same* distributions:

- `keras`: the seed's pipeline step by step (Pillow nearest-neighbour resize to the target size
  as `load_img(target_size=...)` does, then `apply_affine_transform`: one `scipy.ndimage` affine
  resampling per channel in float32, then flips, then `PIL.ImageEnhance.Brightness`). Slow
  (~130 images/s per core) because SciPy resamples each channel separately in float.
- `fused`: decode once, compose resize ∘ rotation ∘ shift ∘ shear ∘ zoom ∘ flip into ONE 2×3
  matrix, resample once with `cv2.warpAffine` on uint8 straight from the decoded source to the
  output size, and apply brightness as a 256-entry lookup table. An order of magnitude faster,
  and it resamples once instead of twice (Keras first resizes with nearest neighbour, then
  interpolates again).

Note on `shear_range`: Keras reads it as an angle in DEGREES. The seed's `shear_range=0.4` is a
shear drawn from ±0.4°, i.e. nearly nothing, though most readers take it for 0.4 rad or 40 %.
We reproduce it as Keras defines it.

Examples:
    >>> t = create_transform(SEED_AUGMENT, 299, train=True, seed=0)   # doctest: +SKIP
    >>> t(Path("images/cat.1.jpg")).shape                              # doctest: +SKIP
    torch.Size([3, 299, 299])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import torch
import yaml
from PIL import Image, ImageEnhance

from stepscope.errors import DataError
from stepscope.train.data import decode_rgb, open_rgb

Backend = Literal["fused", "keras"]
ShiftRange = float | int | tuple[float, ...]

# Keras fill modes (scipy.ndimage modes) and the OpenCV border that reproduces each.
# scipy 'nearest' repeats the edge pixel, exactly cv2's BORDER_REPLICATE.
FILL_MODES: dict[str, int] = {
    "nearest": cv2.BORDER_REPLICATE,
    "constant": cv2.BORDER_CONSTANT,
    "reflect": cv2.BORDER_REFLECT,
    "wrap": cv2.BORDER_WRAP,
}


@dataclass(frozen=True)
class AugmentParams:
    """Augmentation settings, named and defaulted exactly like Keras's ImageDataGenerator.

    Attributes:
        rotation_range: degrees; θ uniform in ±rotation_range.
        width_shift_range: float < 1 → fraction of the width, float ≥ 1 → pixels (uniform);
            int or tuple → Keras's discrete draw (a value from the set, random sign).
        height_shift_range: the same for the height.
        shear_range: DEGREES (Keras's definition; 0.4 means ±0.4°, almost no shear).
        zoom_range: float z → zx, zy drawn independently from [1-z, 1+z]; or (lo, hi).
            Values < 1 enlarge the content.
        horizontal_flip: mirror left-right with p = 0.5.
        vertical_flip: mirror top-bottom with p = 0.5.
        brightness_range: (lo, hi) factor for PIL ImageEnhance.Brightness, or None.
        fill_mode: nearest | constant | reflect | wrap (points outside the image).
    """

    rotation_range: float = 0.0
    width_shift_range: ShiftRange = 0.0
    height_shift_range: ShiftRange = 0.0
    shear_range: float = 0.0
    zoom_range: float | tuple[float, float] = 0.0
    horizontal_flip: bool = False
    vertical_flip: bool = False
    brightness_range: tuple[float, float] | None = None
    fill_mode: str = "nearest"

    def zoom_bounds(self) -> tuple[float, float]:
        """(lo, hi) of the zoom draw, as Keras turns `zoom_range` into a pair."""
        if isinstance(self.zoom_range, tuple):
            return float(self.zoom_range[0]), float(self.zoom_range[1])
        return 1.0 - self.zoom_range, 1.0 + self.zoom_range

    # free-form: the augmentation as a YAML mapping
    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe mapping (tuples as lists), for config.yaml."""
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }


# The seed's generator (see REFERENCE.md): the values its author wrote.
SEED_AUGMENT = AugmentParams(
    rotation_range=30,
    width_shift_range=0.4,
    height_shift_range=0.4,
    shear_range=0.4,  # degrees: ±0.4°, nearly nothing (Keras's definition)
    zoom_range=0.25,
    horizontal_flip=True,
    brightness_range=(0.5, 1.5),
    fill_mode="nearest",
)

AUGMENT_KEYS = tuple(f.name for f in dataclasses.fields(AugmentParams))


def resolve_augment(spec: str) -> AugmentParams | None:
    """Turn `--augment` into parameters: "seed", "none", or a YAML file with Keras's keys.

    Keys missing from the file take Keras's defaults (no augmentation of that kind).

    Raises:
        DataError: the file does not exist or is not YAML, an unknown key, a bad value.

    Examples:
        >>> resolve_augment("seed") == SEED_AUGMENT
        True
        >>> resolve_augment("none") is None
        True
    """
    if spec == "seed":
        return SEED_AUGMENT
    if spec == "none":
        return None
    path = Path(spec)
    if not path.is_file():
        raise DataError(
            f"--augment {spec!r}: expected 'seed', 'none' or a YAML file, and no such file exists."
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML ({exc}); fix the file.") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise DataError(
            f"{path}: expected a mapping of augmentation keys, got {type(raw).__name__}"
        )
    return augment_from_mapping(raw, source=str(path))


def augment_from_mapping(raw: Mapping[str, Any], source: str = "augment") -> AugmentParams:
    """Build validated `AugmentParams` from a mapping with Keras's key names."""
    unknown = sorted(set(raw) - set(AUGMENT_KEYS))
    if unknown:
        raise DataError(
            f"{source}: unknown augmentation key(s) {unknown}; valid keys: {list(AUGMENT_KEYS)}"
        )
    values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items()}
    try:
        params = AugmentParams(**values)
    except TypeError as exc:  # pragma: no cover - unknown keys are caught above
        raise DataError(f"{source}: {exc}") from exc
    _validate(params, source)
    return params


def _validate(p: AugmentParams, source: str) -> None:
    def bad(key: str, expected: str) -> DataError:
        return DataError(f"{source}: {key}={getattr(p, key)!r}; expected {expected}")

    def non_negative(v: object) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0

    for key in ("rotation_range", "shear_range"):
        if not non_negative(getattr(p, key)):
            raise bad(key, "a number ≥ 0 (degrees)")
    for key in ("width_shift_range", "height_shift_range"):
        v = getattr(p, key)
        if not (non_negative(v) or (isinstance(v, tuple) and v and all(map(non_negative, v)))):
            raise bad(key, "a number ≥ 0 (fraction if < 1, else pixels) or a list of them")
    z = p.zoom_range
    if not (
        non_negative(z)
        or (isinstance(z, tuple) and len(z) == 2 and all(map(non_negative, z)) and z[0] <= z[1])
    ):
        raise bad("zoom_range", "a number ≥ 0 or [lo, hi] with 0 ≤ lo ≤ hi")
    for key in ("horizontal_flip", "vertical_flip"):
        if not isinstance(getattr(p, key), bool):
            raise bad(key, "true or false")
    b = p.brightness_range
    if b is not None and not (
        isinstance(b, tuple) and len(b) == 2 and all(map(non_negative, b)) and b[0] <= b[1]
    ):
        raise bad("brightness_range", "[lo, hi] with 0 ≤ lo ≤ hi, or null")
    if p.fill_mode not in FILL_MODES:
        raise bad("fill_mode", f"one of {sorted(FILL_MODES)}")


# --------------------------------------------------------------------------- parameter draw


@dataclass(frozen=True)
class TransformDraw:
    """One drawn set of transform parameters (Keras's `transform_parameters` dict, typed).

    Keras's naming quirk is kept: `tx` is drawn from `height_shift_range` (scaled by the number of
    rows) yet the affine matrix applies it along x (columns), and `ty` the other way round. For
    the square images trained here this is invisible.
    """

    theta_deg: float = 0.0
    tx: float = 0.0
    ty: float = 0.0
    shear_deg: float = 0.0
    zx: float = 1.0
    zy: float = 1.0
    flip_horizontal: bool = False
    flip_vertical: bool = False
    brightness: float | None = None


IDENTITY = TransformDraw()


def draw_transform(
    aug: AugmentParams, img_hw: tuple[int, int], rng: np.random.RandomState
) -> TransformDraw:
    """Draw parameters exactly as `ImageDataGenerator.get_random_transform` does.

    Same calls on the same legacy RandomState stream in the same order: seeding `rng` with s
    gives the draw Keras gives after `np.random.seed(s)`. `img_hw` is the image's size AFTER the
    resize to the target size, so fractional shifts are fractions of the target size.
    """
    theta = rng.uniform(-aug.rotation_range, aug.rotation_range) if aug.rotation_range else 0.0
    tx = _draw_shift(aug.height_shift_range, img_hw[0], rng)
    ty = _draw_shift(aug.width_shift_range, img_hw[1], rng)
    shear = rng.uniform(-aug.shear_range, aug.shear_range) if aug.shear_range else 0.0
    lo, hi = aug.zoom_bounds()
    zx, zy = (1.0, 1.0) if lo == 1 and hi == 1 else tuple(rng.uniform(lo, hi, 2))
    # Keras draws both coins even when a flip is disabled; skipping a draw would shift the stream.
    flip_h = bool(rng.random() < 0.5) and aug.horizontal_flip
    flip_v = bool(rng.random() < 0.5) and aug.vertical_flip
    brightness = None
    if aug.brightness_range is not None:
        brightness = float(rng.uniform(aug.brightness_range[0], aug.brightness_range[1]))
    return TransformDraw(
        float(theta),
        float(tx),
        float(ty),
        float(shear),
        float(zx),
        float(zy),
        flip_h,
        flip_v,
        brightness,
    )


def _draw_shift(shift_range: ShiftRange, size: int, rng: np.random.RandomState) -> float:
    if not shift_range:
        return 0.0
    if isinstance(shift_range, float):
        value = float(rng.uniform(-shift_range, shift_range))
    else:
        # Keras's `np.random.choice(range)` branch: an int n picks from 0..n-1, a list from
        # its values; then a random sign.
        choices = shift_range if isinstance(shift_range, int) else list(shift_range)
        value = float(rng.choice(choices)) * float(rng.choice([-1, 1]))
    if np.max(shift_range) < 1:
        value *= size
    return value


# --------------------------------------------------------------------------- matrices


def keras_matrix(d: TransformDraw, h: int, w: int) -> np.ndarray | None:
    """The 3×3 matrix `apply_affine_transform` hands to scipy, or None when it skips the warp.

    It maps OUTPUT array coordinates (row, col, 1) to INPUT coordinates (scipy's convention).
    Built as Keras builds it: rotation · shift · shear · zoom in (x, y) coordinates, centred with
    `transform_matrix_offset_center(m, h, w)` (which, like Keras, offsets coordinate 0 by h), then
    rows and columns 0/1 swapped to go from (x, y) to numpy's (row, col).
    """
    m: np.ndarray | None = None
    if d.theta_deg != 0:
        t = np.deg2rad(d.theta_deg)
        m = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    if d.tx != 0 or d.ty != 0:
        m = _then(m, np.array([[1, 0, d.tx], [0, 1, d.ty], [0, 0, 1]], dtype=np.float64))
    if d.shear_deg != 0:
        s = np.deg2rad(d.shear_deg)
        m = _then(m, np.array([[1, -np.sin(s), 0], [0, np.cos(s), 0], [0, 0, 1]]))
    if d.zx != 1 or d.zy != 1:
        m = _then(m, np.array([[d.zx, 0, 0], [0, d.zy, 0], [0, 0, 1]], dtype=np.float64))
    if m is None:
        return None
    o_x, o_y = float(h) / 2 - 0.5, float(w) / 2 - 0.5
    offset = np.array([[1, 0, o_x], [0, 1, o_y], [0, 0, 1]])
    reset = np.array([[1, 0, -o_x], [0, 1, -o_y], [0, 0, 1]])
    m = offset @ m @ reset
    m[:, [0, 1]] = m[:, [1, 0]]
    m[[0, 1]] = m[[1, 0]]
    return m


def _then(m: np.ndarray | None, nxt: np.ndarray) -> np.ndarray:
    return nxt if m is None else m @ nxt


def fused_matrix(d: TransformDraw, src_hw: tuple[int, int], out_hw: tuple[int, int]) -> np.ndarray:
    """One 2×3 matrix, OpenCV (x, y) coordinates, mapping output pixels to SOURCE pixels.

    Composes, in (row, col) coordinates, source ← resize ← Keras affine ← flip:
    - flip: Keras flips the warped image, so an output pixel first finds its mirror position;
    - Keras affine: `keras_matrix` at the output size (shifts already in target pixels);
    - resize: the target grid laid over the source grid with pixel centres aligned,
      src = (dst + 0.5) · src_size / dst_size − 0.5 (what cv2.resize INTER_LINEAR does).
    Use with `cv2.WARP_INVERSE_MAP`.
    """
    (h0, w0), (h, w) = src_hw, out_hw
    flip = np.eye(3)
    if d.flip_horizontal:
        flip[1] = [0, -1, w - 1]
    if d.flip_vertical:
        flip[0] = [-1, 0, h - 1]
    sy, sx = h0 / h, w0 / w
    resize = np.array([[sy, 0, 0.5 * sy - 0.5], [0, sx, 0.5 * sx - 0.5], [0, 0, 1]])
    k = keras_matrix(d, h, w)
    rc = resize @ (k if k is not None else np.eye(3)) @ flip
    # (row, col) → (x, y): swap both the input and the output coordinate order.
    xy = rc[[1, 0]][:, [1, 0, 2]]
    return np.ascontiguousarray(xy)


# --------------------------------------------------------------------------- applying


def apply_reference(x: np.ndarray, d: TransformDraw, fill_mode: str = "nearest") -> np.ndarray:
    """Keras's `apply_transform` on a float32 HWC image already at the target size.

    scipy.ndimage.affine_transform per channel (order=1: bilinear; mode=fill_mode, cval 0),
    then horizontal and vertical flips, then PIL brightness, in Keras's order. Returns float32.
    """
    # SciPy only for this faithful reference path: the fused path and GPU machines need none.
    import scipy.ndimage

    m = keras_matrix(d, x.shape[0], x.shape[1])
    if m is not None:
        channels = [
            scipy.ndimage.affine_transform(
                x[..., c], m[:2, :2], m[:2, 2], order=1, mode=fill_mode, cval=0.0
            )
            for c in range(x.shape[2])
        ]
        x = np.stack(channels, axis=-1)
    if d.flip_horizontal:
        x = x[:, ::-1]
    if d.flip_vertical:
        x = x[::-1]
    if d.brightness is not None:
        x = _pil_brightness(x, d.brightness)
    return np.ascontiguousarray(x, dtype=np.float32)


def _pil_brightness(x: np.ndarray, factor: float) -> np.ndarray:
    """Keras's `apply_brightness_shift(x, factor, scale=False)`.

    The float image goes through a uint8 PIL image: `astype('uint8')` TRUNCATES, and PIL's blend
    with black truncates again. Only images outside 0..255 are rescaled around the trip.
    """
    x_min, x_max = float(np.min(x)), float(np.max(x))
    local_scale = x_min < 0 or x_max > 255
    y: np.ndarray = x.astype(np.float32)
    if local_scale:
        y = y - y.min()
        if y.max() != 0:
            y = y / y.max()
        y = y * 255
    img = Image.fromarray(y.astype(np.uint8), "RGB")
    out: np.ndarray = np.asarray(ImageEnhance.Brightness(img).enhance(factor), dtype=np.float32)
    if local_scale:
        out = out / 255 * (x_max - x_min) + x_min
    return out


def brightness_lut(factor: float) -> np.ndarray:
    """256-entry table equal to PIL `ImageEnhance.Brightness(img).enhance(factor)` on uint8.

    PIL blends with a black image in float32 and truncates toward zero, clipping to 0..255.
    """
    v = np.arange(256, dtype=np.float32) * np.float32(factor)
    return np.clip(np.floor(v), 0, 255).astype(np.uint8)


def apply_fused(
    src: np.ndarray, d: TransformDraw, out_hw: tuple[int, int], fill_mode: str = "nearest"
) -> np.ndarray:
    """Warp a uint8 HWC source once to the output size and apply brightness; returns uint8 HWC."""
    m = fused_matrix(d, (src.shape[0], src.shape[1]), out_hw)
    out = cv2.warpAffine(
        src,
        m,
        (out_hw[1], out_hw[0]),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=FILL_MODES[fill_mode],
        borderValue=(0, 0, 0),
    )
    if d.brightness is not None:
        out = cv2.LUT(out, brightness_lut(d.brightness))
    return np.asarray(out)


# --------------------------------------------------------------------------- transforms


class ImageTransform:
    """Path → uint8 CHW tensor at `img_size`; see `create_transform`."""

    def __init__(
        self,
        augment: AugmentParams | None,
        img_size: int,
        *,
        train: bool,
        backend: Backend,
        seed: int | None,
    ) -> None:
        if backend not in ("fused", "keras"):
            raise DataError(f"augmentation backend {backend!r}; expected 'fused' or 'keras'")
        if img_size < 1:
            raise DataError(f"image size {img_size}; expected a positive number of pixels")
        self.augment = augment if train else None
        self.img_size = img_size
        self.backend = backend
        self.seed = seed
        self._rng: np.random.RandomState | None = None
        self._rng_key: tuple[int, int] | None = None

    def __call__(self, path: Path) -> torch.Tensor:
        hwc = self._keras(path) if self.backend == "keras" else self._fused(path)
        return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))

    def _fused(self, path: Path) -> np.ndarray:
        src = decode_rgb(path)
        size = (self.img_size, self.img_size)
        if self.augment is None:
            if src.shape[:2] == size:
                return src
            return np.asarray(cv2.resize(src, (size[1], size[0]), interpolation=cv2.INTER_LINEAR))
        d = draw_transform(self.augment, size, self.rng())
        return apply_fused(src, d, size, self.augment.fill_mode)

    def _keras(self, path: Path) -> np.ndarray:
        img = open_rgb(path)
        if img.size != (self.img_size, self.img_size):
            # load_img(target_size=...) with flow_from_dataframe's default interpolation.
            img = img.resize((self.img_size, self.img_size), Image.Resampling.NEAREST)
        if self.augment is None:
            return np.asarray(img)
        x = np.asarray(img, dtype=np.float32)  # img_to_array
        d = draw_transform(self.augment, (x.shape[0], x.shape[1]), self.rng())
        y = apply_reference(x, d, self.augment.fill_mode)
        # Keras would hand this float32 to the model; we ship uint8, so round (≤ 0.5 off).
        return np.clip(np.rint(y), 0, 255).astype(np.uint8)

    def rng(self) -> np.random.RandomState:
        """This process's parameter RNG, (re)seeded on first use in each DataLoader worker.

        Forked workers inherit the parent's RNG state, so without reseeding every worker would
        draw the same parameters (the classic duplicated-augmentation bug). No worker_init_fn is
        needed: the first call inside a worker sees `get_worker_info()` and reseeds from the
        worker's torch seed (base_seed + worker id; base_seed is drawn per epoch from the main
        process's torch RNG, so `torch.manual_seed` makes runs repeatable) mixed with `seed`.
        In the main process, `seed` seeds a legacy RandomState exactly as `np.random.seed`
        would, so draws match Keras's for the same seed.
        """
        info = torch.utils.data.get_worker_info()
        key = None if info is None else (info.id, info.seed)
        if self._rng is None or key != self._rng_key:
            self._rng_key = key
            if info is None:
                self._rng = np.random.RandomState(self.seed)
            else:
                entropy = [info.seed & 0xFFFFFFFF, info.seed >> 32, info.id]
                entropy += [] if self.seed is None else [self.seed]
                bits = np.random.MT19937(np.random.SeedSequence(entropy))
                self._rng = np.random.RandomState(bits)
                # Not cv2.setNumThreads(1) here, though workers fill the cores already: OpenCV's
                # pthreads pool cannot be resized in a forked child once the parent has used it
                # (the call deadlocks; measured). Callers set it before creating the workers.
        return self._rng


def create_transform(
    augment: AugmentParams | None,
    img_size: int,
    *,
    train: bool,
    backend: Backend = "fused",
    seed: int | None = None,
) -> ImageTransform:
    """Build the path → uint8 CHW tensor transform for training or validation.

    `train=False` (or `augment=None`) decodes and resizes only: Pillow nearest-neighbour for the
    `keras` backend (as Keras loads images), cv2 INTER_LINEAR for `fused` (the same resampling
    the fused training warp uses). Undecodable files raise `CorruptImageError`, which
    `ImageDataset` turns into a skip marker.

    Examples:
        >>> t = create_transform(SEED_AUGMENT, 299, train=True, backend="fused", seed=0)
        >>> t.backend
        'fused'
    """
    return ImageTransform(augment, img_size, train=train, backend=backend, seed=seed)
