"""Datasets: what the user points at (CSV + image folder, or one folder per class), checked.

Everything a user can get wrong with a dataset fails here, before training starts, with a
`DataError` that names what was found and what to do. Files that only turn out to be broken when
they are decoded (corrupt or truncated JPEGs) cannot be found that early without reading every
byte, so `ImageDataset` turns them into a marker and `collate_skip_bad` drops them from the batch
while reporting them: a bad file costs one image, never an epoch.

Examples:
    >>> split = resolve_dataset(csv=Path("data/train.csv"), val_csv=Path("data/valid.csv"),
    ...                         images=Path("data/images"))            # doctest: +SKIP
    >>> ds = ImageDataset(split.train, create_transform(SEED_AUGMENT, 299, train=True))
    ...                                                                 # doctest: +SKIP
    >>> loader = DataLoader(ds, batch_size=8, collate_fn=collate_skip_bad)  # doctest: +SKIP
"""

from __future__ import annotations

import csv as csv_module
import io
import os
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

import cv2
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from stepscope.errors import DataError
from stepscope.observe.stages import Stage
from stepscope.train import libjpeg

# Keras's DirectoryIterator white list, plus webp which Pillow reads too.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".tif", ".tiff", ".webp"})
_SHOW_FIRST = 5  # how many offending names an error message lists before "and N more"
_JPEG_SOI = b"\xff\xd8\xff"
_CV2_RGB: int | None = getattr(cv2, "IMREAD_COLOR_RGB", None)
# Pillow's own threshold (its DecompressionBombWarning): ~89.5 MP, 268 MB as RGB once decoded.
# A bigger image in a training set is far more likely a decompression bomb than a photo.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485
_max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS


def set_max_image_pixels(limit: int | None) -> None:
    """Refuse images above ``limit`` pixels before decoding them (None or 0: no limit).

    Set once in the trainer process before its DataLoader workers start (they inherit it).
    """
    global _max_image_pixels
    _max_image_pixels = limit or None
    # Pillow refuses on its own at twice its threshold; a limit raised above it must not be
    # overruled there (our check has already run when Pillow decodes).
    if limit is None or limit <= 0 or limit > DEFAULT_MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = None if not limit or limit <= 0 else 2 * limit


class Item(NamedTuple):
    """One labelled image: where it is and its class index (into `DatasetSplit.classes`)."""

    path: Path
    label: int


@dataclass
class DatasetSplit:
    """A resolved dataset: train and validation items, class names, what was skipped."""

    train: list[Item]
    val: list[Item]
    classes: list[str]
    skipped_missing: list[str] = field(default_factory=list)


class CorruptImageError(DataError):
    """An image file that exists but cannot be decoded (corrupt, truncated, not an image)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"cannot decode image {path}: {reason}; expected a readable JPEG/PNG/BMP/TIFF/WebP. "
            "Replace or remove the file (training skips it and counts it)."
        )
        self.path = path
        self.reason = reason


class BadSample(NamedTuple):
    """What `ImageDataset` returns for a file it could not decode (a marker, not an error)."""

    path: str
    reason: str


class WarnedFile(str):
    """A file kept in its batch although the JPEG decoder warned about it (it still decoded
    whole, e.g. ``Corrupt JPEG data: 4 extraneous bytes before marker 0xd9``): listed among a
    batch's ``bad_files`` so it is counted and named, but not dropped."""

    warning: str

    def __new__(cls, path: str, warning: str) -> WarnedFile:
        obj = super().__new__(cls, path)
        obj.warning = warning
        return obj

    def __reduce__(self) -> tuple[type[WarnedFile], tuple[str, str]]:
        # DataLoader workers send it back pickled; a str subclass would lose its warning.
        return WarnedFile, (str(self), self.warning)


# Files this process decoded with a libjpeg warning since the last collate: a DataLoader worker
# fetches a batch's items and then collates them, so the collate hands them on with that batch.
_warned: list[WarnedFile] = []


class Batch(NamedTuple):
    """A collated batch: uint8 NCHW images, int64 labels, and the files dropped from it.

    A NamedTuple, so DataLoader's pin_memory keeps the type and `images, labels, bad = batch`
    works. When every item of a batch was bad, `images` has shape (0, 3, 0, 0) and `labels` shape
    (0,): the loop must count `bad_files` and skip the step (a model cannot run on it).
    `bad_files` also names the batch's images kept despite a decoder warning, as `WarnedFile`.
    """

    images: torch.Tensor
    labels: torch.Tensor
    bad_files: list[str]


Sample = tuple[torch.Tensor, int]


# --------------------------------------------------------------------------- decoding


def open_rgb(path: Path) -> Image.Image:
    """Open and fully decode an image as an 8-bit RGB Pillow image (Keras's `load_img` path).

    Grayscale, palette, CMYK, RGBA (alpha dropped, as Keras's `load_img` does) and 16-bit images
    all come out RGB uint8. Pillow's own conversion of 16-bit grayscale ("I;16") to RGB clips
    every value above 255 to white, so those are rescaled to 8 bits here first.

    Raises:
        CorruptImageError: the file is missing, truncated, corrupt or not an image.
    """
    data = _read(path)
    _check_pixels(data, path)
    return _pil_rgb(data, path)


def decode_rgb(path: Path) -> np.ndarray:
    """Decode an image file to an HWC uint8 RGB array, as fast as the CPU allows.

    JPEGs go to OpenCV's libjpeg-turbo decoder straight into an RGB buffer: measured 2× the
    images/s of Pillow + `np.asarray` (which copies the decoded image once more), with identical
    pixels for RGB, grayscale and progressive JPEGs. EXIF orientation is ignored, as Pillow and
    Keras ignore it. Anything OpenCV refuses (truncated or corrupt data, other formats) goes
    through Pillow, which either decodes it or says precisely what is wrong.

    Raises:
        CorruptImageError: the file is missing, truncated, corrupt or not an image.
    """
    data = _read(path)
    _check_pixels(data, path)
    if data[:3] == _JPEG_SOI:
        flags = (_CV2_RGB or cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION
        # libjpeg prints recoverable damage to fd 2 itself; caught, it is named with the file.
        rgb, said = libjpeg.quietly(lambda: cv2.imdecode(np.frombuffer(data, np.uint8), flags))
        if rgb is not None:
            if said:
                _warned.append(WarnedFile(str(path), "; ".join(said)))
            # OpenCV < 4.10 has no RGB output flag and decodes to BGR.
            return np.asarray(rgb if _CV2_RGB else cv2.cvtColor(rgb, cv2.COLOR_BGR2RGB))
    return np.asarray(_pil_rgb(data, path))


def _read(path: Path) -> bytes:
    # One read of the whole file, as Keras's load_img does: the page cache serves it or the
    # disk does, and /proc/PID/io counts it either way.
    try:
        with Stage("read") as st:
            data = path.read_bytes()
            st.nbytes = len(data)
        return data
    except OSError as exc:
        raise CorruptImageError(path, f"{type(exc).__name__}: {exc}") from exc


def _check_pixels(data: bytes, path: Path) -> None:
    """Refuse an image above the pixel limit from its header alone, before any decoding."""
    if _max_image_pixels is None:
        return
    with warnings.catch_warnings():
        # Pillow warns on open above its own threshold; our limit decides, in our words.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
        except Image.DecompressionBombError as exc:
            raise CorruptImageError(path, f"refused before decoding: {exc}") from exc
        except Exception:  # an unreadable header: the decoders say what is wrong
            return
    if width * height > _max_image_pixels:
        raise CorruptImageError(
            path, f"{width} x {height} = {width * height / 1e6:.1f} MP is above the "
            f"{_max_image_pixels / 1e6:.1f} MP limit (a decompression bomb, or an image far "
            f"larger than training needs: {width * height * 3 / 1e6:.0f} MB decoded); refused "
            "before decoding. Raise --max-image-pixels to allow it")


def _pil_rgb(data: bytes, path: Path) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            # Pillow decodes lazily: load() is where a truncated JPEG raises.
            img.load()
        return _to_rgb(img)
    except UnidentifiedImageError as exc:
        # Pillow names the in-memory buffer (<_io.BytesIO object at 0x...>), not the file.
        raise CorruptImageError(path, "not an image format Pillow can identify (empty, random "
                                "or another kind of file)") from exc
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise CorruptImageError(path, f"{type(exc).__name__}: {exc}") from exc


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("I", "F") or img.mode.startswith("I;16"):
        wide = np.asarray(img).astype(np.float64)
        peak = float(wide.max()) if wide.size else 0.0
        # 16-bit sources span 0..65535 (Pillow also opens 16-bit PNGs as "I"); wider int/float
        # data is rescaled by its own peak; data already within 0..255 is kept as it is.
        scale = 1.0
        if img.mode.startswith("I;16") or 255 < peak <= 65535:
            scale = 255.0 / 65535.0
        elif peak > 65535:
            scale = 255.0 / peak
        gray = np.clip(np.rint(wide * scale), 0, 255).astype(np.uint8)
        return Image.fromarray(gray, "L").convert("RGB")
    return img.convert("RGB")


# --------------------------------------------------------------------------- resolving


def resolve_dataset(
    *,
    csv: Path | None = None,
    val_csv: Path | None = None,
    images: Path | None = None,
    x_col: str = "Photo",
    y_col: str = "Class",
    folder: Path | None = None,
    val_split: float = 0.2,
    seed: int = 0,
    on_missing: Literal["error", "skip"] = "error",
    follow_links: bool = False,
) -> DatasetSplit:
    """Resolve the user's dataset arguments into checked train/val items.

    Either `csv` (the seed's layout: a CSV with a file-name column and a class column, images in
    `images`, default the CSV's folder) or `folder` (one subfolder per class). Without `val_csv`
    (or with `folder`) the validation set is a stratified random `val_split` of the training
    rows, fixed by `seed`. Classes are sorted names, labels index into them.

    Every image path is resolved (symlinks included) and must stay inside the image folder
    (``folder`` or ``images``) unless ``follow_links``: a link in a dataset pointing at
    ``/etc/shadow`` is refused, not read.

    Raises:
        DataError: both or neither source given, CSV not found, a missing column, a file path
            or link escaping the image folder, listed files missing (`on_missing="error"`), fewer than two
            classes, no images.

    Examples:
        >>> split = resolve_dataset(csv=Path("train.csv"), images=Path("images"))  # doctest: +SKIP
        >>> split.classes                                                       # doctest: +SKIP
        ['cat', 'dog']
    """
    if (csv is None) == (folder is None):
        raise DataError(
            "give exactly one dataset source: --csv FILE (with --images DIR) or --folder DIR "
            f"(one subfolder per class); got csv={csv}, folder={folder}"
        )
    if on_missing not in ("error", "skip"):
        raise DataError(f"on_missing must be 'error' or 'skip', got {on_missing!r}")
    if not 0.0 <= val_split < 1.0:
        raise DataError(f"val_split must be in [0, 1), got {val_split}")
    if folder is not None:
        train_rows, val_rows = _stratified_split(_scan_folder(folder, follow_links), val_split,
                                                 seed)
        return _to_split(train_rows, val_rows, [])
    assert csv is not None
    image_dir = images if images is not None else csv.parent
    rows, skipped = _read_csv_rows(csv, image_dir, x_col, y_col, on_missing, follow_links)
    if val_csv is None:
        train_rows, val_rows = _stratified_split(rows, val_split, seed)
    else:
        val_rows, val_skipped = _read_csv_rows(val_csv, image_dir, x_col, y_col, on_missing,
                                               follow_links)
        train_rows, skipped = rows, skipped + val_skipped
    return _to_split(train_rows, val_rows, skipped)


def _to_split(
    train_rows: list[tuple[Path, str]], val_rows: list[tuple[Path, str]], skipped: list[str]
) -> DatasetSplit:
    if not train_rows:
        raise DataError(
            "the training set is empty (no rows, or every listed file was missing); "
            "expected at least one image per class. Check the CSV/folder and --images."
        )
    classes = sorted({label for _, label in train_rows})
    if len(classes) < 2:
        raise DataError(
            f"found one class only ({classes[0]!r}); a classifier needs at least two. "
            "Check the class column (--y-col) or add the other class's images."
        )
    unknown = sorted({label for _, label in val_rows} - set(classes))
    if unknown:
        raise DataError(
            f"validation classes {unknown} do not occur in training (classes {classes}); "
            "fix the class column of the validation CSV."
        )
    index = {name: i for i, name in enumerate(classes)}
    return DatasetSplit(
        train=[Item(p, index[c]) for p, c in train_rows],
        val=[Item(p, index[c]) for p, c in val_rows],
        classes=classes,
        skipped_missing=skipped,
    )


def _read_csv_rows(
    csv_path: Path, image_dir: Path, x_col: str, y_col: str, on_missing: str,
    follow_links: bool = False,
) -> tuple[list[tuple[Path, str]], list[str]]:
    if not csv_path.is_file():
        raise DataError(f"CSV not found: {csv_path}; give the path of an existing CSV file.")
    if not image_dir.is_dir():
        raise DataError(f"image folder not found: {image_dir}; give it with --images DIR.")
    try:
        # utf-8-sig: spreadsheet programs put a BOM in front of the first column name.
        raw = _csv_cells(csv_path, x_col, y_col, "utf-8-sig")
    except UnicodeDecodeError:
        # Not UTF-8: a spreadsheet's legacy export (Latin-1 / Windows-1252) is the usual case,
        # and Latin-1 decodes any byte, so names come out as the user's program showed them.
        raw = _csv_cells(csv_path, x_col, y_col, "latin-1")
    rows: list[tuple[Path, str]] = []
    missing: list[str] = []
    for name, label, line in raw:
        if not name.strip() or not label.strip():
            raise DataError(f"{csv_path} line {line}: empty {x_col!r} or {y_col!r} cell.")
        path = _inside(image_dir, name.strip(), csv_path, line, follow_links)
        if path.is_file():
            rows.append((path, label.strip()))
        else:
            missing.append(name.strip())
    if missing and on_missing == "error":
        shown = ", ".join(missing[:_SHOW_FIRST])
        more = f" and {len(missing) - _SHOW_FIRST} more" if len(missing) > _SHOW_FIRST else ""
        raise DataError(
            f"{len(missing)} file(s) listed in {csv_path} do not exist in {image_dir}: "
            f"{shown}{more}. Fix --images, or pass --on-missing skip to train without them."
        )
    return rows, missing


def _csv_cells(csv_path: Path, x_col: str, y_col: str, encoding: str
               ) -> list[tuple[str, str, int]]:
    """(file name, class, line number) of every row; the CSV's own faults as DataError."""
    try:
        with csv_path.open(newline="", encoding=encoding) as fh:
            reader = csv_module.DictReader(fh)
            columns = list(reader.fieldnames or [])
            missing_cols = [c for c in (x_col, y_col) if c not in columns]
            if missing_cols:
                raise DataError(
                    f"{csv_path}: column(s) {missing_cols} not found; the CSV has columns "
                    f"{columns}. Name the right ones with --x-col / --y-col."
                )
            return [(row[x_col] or "", row[y_col] or "", n) for n, row in enumerate(reader, start=2)]
    except csv_module.Error as exc:  # a NUL byte, a field over the csv module's size limit
        raise DataError(f"{csv_path} is not a readable CSV ({exc}); expected comma-separated "
                        "rows with a header line. Fix or re-export the file.") from exc


def _inside(image_dir: Path, name: str, csv_path: Path, line: int,
            follow_links: bool = False) -> Path:
    """Join a CSV file name to the image folder, refusing names that lead outside it.

    First lexically (`../x.jpg`, an absolute path elsewhere), then with every symlink resolved,
    so a link placed in the folder cannot hand out a file from elsewhere (unless
    ``follow_links``).
    """
    if "\0" in name:
        raise DataError(f"{csv_path} line {line}: file name {name!r} holds a NUL character; "
                        "no file can have that name. Fix the CSV row.")
    root = os.path.normpath(os.path.abspath(image_dir))
    joined = os.path.normpath(os.path.join(root, name))
    if os.path.commonpath([root, joined]) != root or joined == root:
        raise DataError(
            f"{csv_path} line {line}: file {name!r} points outside the image folder {root}; "
            "expected a path relative to --images. Fix the CSV row."
        )
    escape = None if follow_links else _link_escape(Path(joined), Path(root))
    if escape is not None:
        raise DataError(
            f"{csv_path} line {line}: file {name!r} is a link to {escape}, outside the image "
            f"folder {root}; remove the link, or pass --follow-links to trust it."
        )
    return Path(joined)


def _link_escape(path: Path, root: Path) -> str | None:
    """Where ``path`` really leads when that is outside ``root`` (both resolved), else None."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return None if os.path.commonpath([real_root, real]) == real_root else real


def _scan_folder(folder: Path, follow_links: bool = False) -> list[tuple[Path, str]]:
    if not folder.is_dir():
        raise DataError(f"dataset folder not found: {folder}; expected one subfolder per class.")
    rows: list[tuple[Path, str]] = []
    escapes: list[str] = []
    for class_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        for path in sorted(class_dir.rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                escape = None if follow_links else _link_escape(path, folder)
                if escape is not None:
                    escapes.append(f"{path} -> {escape}")
                rows.append((path, class_dir.name))
    if escapes:
        more = f" and {len(escapes) - _SHOW_FIRST} more" if len(escapes) > _SHOW_FIRST else ""
        raise DataError(
            f"{len(escapes)} image(s) under {folder} are links leading outside it: "
            f"{', '.join(escapes[:_SHOW_FIRST])}{more}; remove them, or pass --follow-links "
            "to trust them."
        )
    if not rows:
        raise DataError(
            f"no images found under {folder}; expected {folder}/<class>/<image> files with "
            f"suffixes {sorted(IMAGE_SUFFIXES)}."
        )
    return rows


def _stratified_split(
    rows: list[tuple[Path, str]], val_split: float, seed: int
) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """Hold out `val_split` of every class (rounded), shuffled by `seed`; order kept within."""
    by_class: dict[str, list[int]] = {}
    for i, (_, label) in enumerate(rows):
        by_class.setdefault(label, []).append(i)
    rng = random.Random(seed)
    val_idx: set[int] = set()
    for label in sorted(by_class):
        idx = by_class[label]
        rng.shuffle(idx)
        val_idx.update(idx[: round(len(idx) * val_split)])
    train = [r for i, r in enumerate(rows) if i not in val_idx]
    val = [r for i, r in enumerate(rows) if i in val_idx]
    return train, val


# --------------------------------------------------------------------------- files


def dataset_files(split: DatasetSplit) -> list[Path]:
    """Every distinct file of the split (train then val), for page-cache residency checks."""
    return list(dict.fromkeys(item.path for item in [*split.train, *split.val]))


def total_bytes(paths: Sequence[Path]) -> int:
    """Sum of the files' sizes on disk (files that vanished count 0)."""
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


# --------------------------------------------------------------------------- torch dataset


class ImageDataset(torch.utils.data.Dataset[Sample | BadSample]):
    """Items + a transform (path → uint8 CHW tensor); undecodable files become `BadSample`."""

    def __init__(self, items: Sequence[Item], transform: Callable[[Path], torch.Tensor]) -> None:
        self.items = list(items)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Sample | BadSample:
        path, label = self.items[index]
        try:
            # Read and decode inside are timed as their own stages; the rest is augmentation.
            with Stage("transform"):
                return self.transform(path), label
        except CorruptImageError as exc:
            # Raising here would kill the epoch (and in a worker, the whole DataLoader).
            return BadSample(str(path), exc.reason)


def collate_skip_bad(samples: Sequence[Sample | BadSample]) -> Batch:
    """DataLoader `collate_fn`: stack the good samples, list the bad ones' paths.

    Runs inside the worker process, so the bad file names travel back with the batch and the
    main loop can count them whichever worker found them.
    """
    good = [s for s in samples if not isinstance(s, BadSample)]
    bad: list[str] = [s.path for s in samples if isinstance(s, BadSample)]
    bad += _warned
    _warned.clear()
    if not good:
        return Batch(
            torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty((0,), dtype=torch.int64), bad
        )
    images = torch.stack([img for img, _ in good])
    labels = torch.tensor([label for _, label in good], dtype=torch.int64)
    return Batch(images, labels, bad)
