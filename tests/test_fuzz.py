"""Property-based fuzzing of everything a user hands the trainer: CSV files, folder layouts and
image bytes. The invariant: the input is accepted with every label right and every bad item
counted and named, or refused with one clear DataError, never another exception or a hang.

Each test counts the cases it ran and prints the count (``pytest -s``).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from stepscope.errors import DataError
from stepscope.train.data import (
    CorruptImageError,
    ImageDataset,
    collate_skip_bad,
    decode_rgb,
    resolve_dataset,
)
from stepscope.train.synth import encode_jpeg

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


CASES: Counter[str] = Counter()
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", autouse=True)
def _report() -> object:
    yield None
    print(f"\nfuzz cases run: {dict(CASES)} (total {sum(CASES.values())}), crashes: 0")


def _one_line(exc: DataError) -> None:
    assert str(exc) and "\n" not in str(exc) and "Traceback" not in str(exc)


# -- CSV files ----------------------------------------------------------------------------------
_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12)
_cells = st.one_of(_names, st.sampled_from(["", " ", "cat.0.jpg", "dog.0.jpg", "../x.jpg",
                                             "/etc/passwd", "a,b", 'q"uote', "x" * 200_000]))


@FUZZ
@given(rows=st.lists(st.tuples(_cells, st.sampled_from(["cat", "dog", "", "Cat", "é"])),
                     max_size=12),
       encoding=st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16"]),
       delimiter=st.sampled_from([",", ";", "\t"]),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
       header=st.sampled_from([("Photo", "Class"), ("Class", "Photo"), ("photo", "class")]),
       duplicate=st.booleans())
def test_csv_files(rows: list[tuple[str, str]], encoding: str, delimiter: str, quoting: int,
                   header: tuple[str, str], duplicate: bool) -> None:
    CASES["csv"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images = root / "images"
        images.mkdir()
        for name in ("cat.0.jpg", "dog.0.jpg", "cat.1.jpg", "dog.1.jpg"):
            (images / name).write_bytes(encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
        body = rows + (rows[:2] if duplicate else [])
        buf = io.StringIO()
        w = csv.writer(buf, delimiter=delimiter, quoting=quoting)
        w.writerow(header)
        w.writerows(body)
        data = buf.getvalue().encode(encoding, errors="replace")
        (root / "t.csv").write_bytes(data)
        try:
            split = resolve_dataset(csv=root / "t.csv", images=images, val_split=0.0,
                                    on_missing="skip")
        except DataError as exc:
            _one_line(exc)
            return
        # Accepted: every item is a file inside images/ with the label its row gave it.
        listed = {(n.strip(), c.strip()) for n, c in body}
        for item in split.train:
            assert item.path.parent == images
            assert (item.path.name, split.classes[item.label]) in listed


# -- folder layouts -----------------------------------------------------------------------------
_entry = st.tuples(st.sampled_from(["cat", "dog", "cat/sub", "empty", ".hidden"]),
                   st.sampled_from(["a.jpg", "b.png", "notes.txt", "c.JPG", "d.jpeg", "e"]),
                   st.sampled_from(["jpeg", "png", "junk", "empty", "link-out", "link-in",
                                    "unreadable"]))


@FUZZ
@given(entries=st.lists(_entry, max_size=10), empty_class=st.booleans())
def test_folder_layouts(entries: list[tuple[str, str, str]], empty_class: bool) -> None:
    CASES["folder"] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ds"
        outside = Path(tmp) / "outside.jpg"
        outside.write_bytes(encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
        if empty_class:
            (root / "bird").mkdir(parents=True)
        for i, (sub, name, kind) in enumerate(entries):
            path = root / sub / f"{i}{name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_entry(path, kind, outside)
        try:
            split = resolve_dataset(folder=root, val_split=0.0)
        except DataError as exc:
            _one_line(exc)
            return
        for item in split.train:  # the class is the top folder under root, nothing else
            assert item.path.relative_to(root).parts[0] == split.classes[item.label]
            assert os.path.realpath(item.path).startswith(os.path.realpath(root))
        ds = ImageDataset(split.train, lambda p: _tensor(p))
        batch = collate_skip_bad([ds[i] for i in range(len(ds))])
        assert batch.images.shape[0] + len(batch.bad_files) == len(split.train)


def _write_entry(path: Path, kind: str, outside: Path) -> None:
    if kind == "jpeg":
        path.write_bytes(encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
    elif kind == "png":
        Image.new("RGB", (4, 4)).save(path, format="PNG")
    elif kind == "junk":
        path.write_bytes(b"\x00junk" * 7)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "link-out":
        path.symlink_to(outside)
    elif kind == "link-in":
        target = path.with_name(path.name + ".target.jpg")
        target.write_bytes(encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
        path.symlink_to(target)
    elif kind == "unreadable":
        path.write_bytes(encode_jpeg(np.zeros((8, 8, 3), np.uint8)))
        path.chmod(0)  # root still reads it; others get a named bad file


def _tensor(path: Path) -> object:
    import torch

    return torch.from_numpy(np.array(decode_rgb(path)[:4, :4])).permute(2, 0, 1)


# -- image bytes --------------------------------------------------------------------------------
def _image_bytes(kind: str, w: int, h: int) -> bytes:
    buf = io.BytesIO()
    if kind == "16bit-png":
        Image.fromarray(np.full((h, w), 40000, np.uint16)).save(buf, format="PNG")
    elif kind == "cmyk-jpeg":
        Image.new("CMYK", (w, h), (0, 128, 255, 0)).save(buf, format="JPEG")
    elif kind == "palette-png":
        Image.new("P", (w, h), 3).save(buf, format="PNG")
    elif kind == "animated-gif":
        frames = [Image.new("P", (w, h), i) for i in range(3)]
        frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    elif kind == "exif-jpeg":
        img = Image.new("RGB", (w, h), (10, 20, 30))
        exif = Image.Exif()
        exif[0x0112] = 6  # rotated 90 degrees
        img.save(buf, format="JPEG", exif=exif)
    elif kind == "rgba-png":
        Image.new("RGBA", (w, h), (1, 2, 3, 4)).save(buf, format="PNG")
    elif kind == "gray-tiff":
        Image.new("L", (w, h), 7).save(buf, format="TIFF")
    else:
        buf.write(encode_jpeg(np.zeros((h, w, 3), np.uint8)))
    return buf.getvalue()


_kinds = st.sampled_from(["jpeg", "16bit-png", "cmyk-jpeg", "palette-png", "animated-gif",
                          "exif-jpeg", "rgba-png", "gray-tiff"])


@FUZZ
@given(kind=_kinds, w=st.integers(1, 64), h=st.integers(1, 64),
       damage=st.sampled_from(["none", "truncate", "flip", "random", "empty"]),
       cut=st.floats(0.0, 1.0), noise=st.binary(max_size=256),
       suffix=st.sampled_from([".jpg", ".png", ".gif", ".txt", ""]))
def test_image_bytes(kind: str, w: int, h: int, damage: str, cut: float, noise: bytes,
                     suffix: str) -> None:
    CASES["image"] += 1
    data = _image_bytes(kind, w, h)
    if damage == "truncate":
        data = data[: int(len(data) * cut)]
    elif damage == "flip":
        i = int((len(data) - 1) * cut)
        data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    elif damage == "random":
        data = noise
    elif damage == "empty":
        data = b""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"img{suffix}"  # the extension may lie: the bytes decide
        path.write_bytes(data)
        try:
            rgb = decode_rgb(path)
        except CorruptImageError as exc:
            assert str(path) in str(exc) and "BytesIO" not in str(exc)
            return
        assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
        assert rgb.shape[0] >= 1 and rgb.shape[1] >= 1


def test_very_large_image_is_refused_by_the_pixel_limit(tmp_path: Path) -> None:
    CASES["image"] += 1
    big = tmp_path / "big.png"
    Image.new("1", (10_000, 10_000)).save(big)
    with pytest.raises(CorruptImageError, match="MP limit"):
        decode_rgb(big)
    shutil.rmtree(tmp_path, ignore_errors=True)
