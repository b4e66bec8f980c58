"""Datasets: every bad input a user can give fails early and says what to do; bad image files
cost one image each, never an epoch, even when a DataLoader worker finds them."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from stepscope.errors import DataError
from stepscope.train.augment import SEED_AUGMENT, create_transform
from stepscope.train.data import (
    BadSample,
    Batch,
    CorruptImageError,
    ImageDataset,
    Item,
    WarnedFile,
    collate_skip_bad,
    dataset_files,
    decode_rgb,
    open_rgb,
    resolve_dataset,
    total_bytes,
)
from stepscope.train.synth import encode_jpeg

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


def _jpeg(path: Path, seed: int = 0, hw: tuple[int, int] = (40, 60)) -> Path:
    rgb = np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_jpeg(rgb))
    return path


def _csv(
    path: Path,
    rows: list[tuple[str, str]],
    header: tuple[str, str] = ("Photo", "Class"),
    encoding: str = "utf-8",
) -> Path:
    with path.open("w", newline="", encoding=encoding) as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def seed_layout(tmp_path: Path) -> Path:
    """The seed's layout: images/ plus train.csv and valid.csv, 10 + 4 images."""
    names = [(f"{c}.{i}.jpg", c) for i in range(7) for c in ("cat", "dog")]
    for n, (name, _) in enumerate(names):
        _jpeg(tmp_path / "images" / name, n)
    _csv(tmp_path / "train.csv", names[:10])
    _csv(tmp_path / "valid.csv", names[10:])
    return tmp_path


# --------------------------------------------------------------------------- resolving


def test_csv_with_val_csv(seed_layout: Path) -> None:
    split = resolve_dataset(
        csv=seed_layout / "train.csv",
        val_csv=seed_layout / "valid.csv",
        images=seed_layout / "images",
    )
    assert split.classes == ["cat", "dog"]
    assert len(split.train) == 10 and len(split.val) == 4
    assert split.train[0] == Item(seed_layout / "images" / "cat.0.jpg", 0)
    assert split.train[1].label == 1 and split.skipped_missing == []


def test_csv_without_val_csv_splits_stratified_and_repeatably(seed_layout: Path) -> None:
    kw = {"csv": seed_layout / "train.csv", "images": seed_layout / "images", "val_split": 0.4}
    a = resolve_dataset(**kw, seed=1)  # type: ignore[arg-type]
    b = resolve_dataset(**kw, seed=1)  # type: ignore[arg-type]
    c = resolve_dataset(**kw, seed=2)  # type: ignore[arg-type]
    assert a == b and a.val != c.val
    assert sorted(i.label for i in a.val) == [0, 0, 1, 1]  # 40 % of 5 cats, 40 % of 5 dogs
    assert not {i.path for i in a.train} & {i.path for i in a.val}


def test_images_default_to_the_csv_folder(tmp_path: Path) -> None:
    _jpeg(tmp_path / "a.jpg")
    _jpeg(tmp_path / "b.jpg", 1)
    _csv(tmp_path / "list.csv", [("a.jpg", "x"), ("b.jpg", "y")])
    split = resolve_dataset(csv=tmp_path / "list.csv", val_split=0.0)
    assert [i.path.name for i in split.train] == ["a.jpg", "b.jpg"] and split.val == []


def test_folder_per_class(tmp_path: Path) -> None:
    for c in ("dog", "cat"):
        for i in range(5):
            _jpeg(tmp_path / c / f"{i}.JPG", i)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    split = resolve_dataset(folder=tmp_path, val_split=0.2)
    assert split.classes == ["cat", "dog"]
    assert len(split.train) == 8 and len(split.val) == 2
    assert all(i.path.suffix == ".JPG" for i in split.train)


def test_missing_column_lists_the_columns(seed_layout: Path) -> None:
    with pytest.raises(DataError, match=r"\['Photo', 'Class'\]") as err:
        resolve_dataset(
            csv=seed_layout / "train.csv", images=seed_layout / "images", x_col="filename"
        )
    assert "filename" in str(err.value) and "--x-col" in str(err.value)


def test_bom_in_header_is_ignored(tmp_path: Path) -> None:
    _jpeg(tmp_path / "a.jpg")
    _jpeg(tmp_path / "b.jpg")
    _csv(tmp_path / "t.csv", [("a.jpg", "x"), ("b.jpg", "y")], encoding="utf-8-sig")
    assert len(resolve_dataset(csv=tmp_path / "t.csv", val_split=0.0).train) == 2


def test_missing_files_error_names_first_few_and_count(seed_layout: Path) -> None:
    rows = [(f"gone.{i}.jpg", "cat") for i in range(8)] + [
        ("cat.0.jpg", "cat"),
        ("dog.0.jpg", "dog"),
    ]
    _csv(seed_layout / "bad.csv", rows)
    with pytest.raises(DataError, match="8 file") as err:
        resolve_dataset(csv=seed_layout / "bad.csv", images=seed_layout / "images")
    msg = str(err.value)
    assert "gone.0.jpg" in msg and "gone.4.jpg" in msg and "gone.7.jpg" not in msg
    assert "and 3 more" in msg and "--on-missing skip" in msg


def test_missing_files_skip_records_them(seed_layout: Path) -> None:
    rows = [("gone.jpg", "cat"), ("cat.0.jpg", "cat"), ("dog.0.jpg", "dog")]
    _csv(seed_layout / "bad.csv", rows)
    split = resolve_dataset(
        csv=seed_layout / "bad.csv", images=seed_layout / "images", on_missing="skip", val_split=0.0
    )
    assert split.skipped_missing == ["gone.jpg"] and len(split.train) == 2


@pytest.mark.parametrize("name", ["../outside.jpg", "sub/../../outside.jpg", "/etc/passwd"])
def test_paths_escaping_the_image_folder_are_rejected(seed_layout: Path, name: str) -> None:
    _jpeg(seed_layout / "outside.jpg")
    _csv(seed_layout / "evil.csv", [(name, "cat"), ("dog.0.jpg", "dog")])
    with pytest.raises(DataError, match="outside the image folder"):
        resolve_dataset(csv=seed_layout / "evil.csv", images=seed_layout / "images")


def test_absolute_path_inside_the_folder_is_fine(seed_layout: Path) -> None:
    inside = str((seed_layout / "images" / "cat.0.jpg").resolve())
    _csv(seed_layout / "abs.csv", [(inside, "cat"), ("dog.0.jpg", "dog")])
    split = resolve_dataset(
        csv=seed_layout / "abs.csv", images=seed_layout / "images", val_split=0.0
    )
    assert len(split.train) == 2


def test_one_class_only(seed_layout: Path) -> None:
    _csv(seed_layout / "cats.csv", [("cat.0.jpg", "cat"), ("cat.1.jpg", "cat")])
    with pytest.raises(DataError, match="one class only"):
        resolve_dataset(csv=seed_layout / "cats.csv", images=seed_layout / "images")


def test_empty_dataset(seed_layout: Path) -> None:
    _csv(seed_layout / "empty.csv", [])
    with pytest.raises(DataError, match="empty"):
        resolve_dataset(csv=seed_layout / "empty.csv", images=seed_layout / "images")
    (seed_layout / "nothing").mkdir()
    with pytest.raises(DataError, match="no images"):
        resolve_dataset(folder=seed_layout / "nothing")


def test_csv_not_found_and_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="CSV not found"):
        resolve_dataset(csv=tmp_path / "nope.csv", images=tmp_path)
    with pytest.raises(DataError, match="exactly one"):
        resolve_dataset()
    with pytest.raises(DataError, match="exactly one"):
        resolve_dataset(csv=tmp_path / "a.csv", folder=tmp_path)
    with pytest.raises(DataError, match="val_split"):
        resolve_dataset(folder=tmp_path, val_split=1.0)


def test_val_class_unknown_to_training(seed_layout: Path) -> None:
    _csv(seed_layout / "v.csv", [("cat.0.jpg", "lion")])
    with pytest.raises(DataError, match="lion"):
        resolve_dataset(
            csv=seed_layout / "train.csv",
            val_csv=seed_layout / "v.csv",
            images=seed_layout / "images",
        )


def test_non_ascii_file_names(tmp_path: Path) -> None:
    names = [
        ("chat_été.jpg", "chat"),
        ("猫の写真.jpg", "chat"),
        ("собака.jpg", "chien"),
        ("perro ñ.jpg", "chien"),
    ]
    for n, (name, _) in enumerate(names):
        _jpeg(tmp_path / "img" / name, n)
    _csv(tmp_path / "t.csv", names)
    split = resolve_dataset(csv=tmp_path / "t.csv", images=tmp_path / "img", val_split=0.0)
    ds = ImageDataset(split.train, create_transform(None, 16, train=False))
    assert all(not isinstance(ds[i], BadSample) for i in range(len(ds)))


def test_dataset_files_and_bytes(seed_layout: Path) -> None:
    split = resolve_dataset(
        csv=seed_layout / "train.csv",
        val_csv=seed_layout / "valid.csv",
        images=seed_layout / "images",
    )
    files = dataset_files(split)
    assert len(files) == 14
    assert total_bytes(files) == sum(p.stat().st_size for p in files)


# --------------------------------------------------------------------------- decoding


def _save(tmp_path: Path, name: str, img: Image.Image, **kw: object) -> Path:
    path = tmp_path / name
    img.save(path, **kw)
    return path


def test_every_mode_decodes_to_rgb_uint8(tmp_path: Path) -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    base = Image.fromarray(rgb, "RGB")
    paths = [
        _save(tmp_path, "gray.png", base.convert("L")),
        _save(tmp_path, "gray.jpg", base.convert("L")),
        _save(tmp_path, "cmyk.jpg", base.convert("CMYK")),
        _save(tmp_path, "rgba.png", base.convert("RGBA")),
        _save(tmp_path, "palette.png", base.convert("P")),
        _save(tmp_path, "la.png", base.convert("LA")),
        _save(tmp_path, "bw.bmp", base.convert("1")),
        _save(tmp_path, "img.webp", base),
        _save(tmp_path, "img.tiff", base),
    ]
    for path in paths:
        for decode in (decode_rgb, lambda p: np.asarray(open_rgb(p))):
            out = decode(path)
            assert out.dtype == np.uint8 and out.shape == (20, 30, 3), path.name


def test_sixteen_bit_png_is_rescaled_not_clipped(tmp_path: Path) -> None:
    g16 = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "g16.png"), g16)
    rgb16 = np.stack([g16, g16, g16], axis=-1)
    cv2.imwrite(str(tmp_path / "rgb16.png"), rgb16)
    for name in ("g16.png", "rgb16.png"):
        out = decode_rgb(tmp_path / name)
        assert out.shape == (1, 4, 3)
        np.testing.assert_array_equal(out[0, :, 0], [0, 1, 128, 255])


def test_cv2_and_pillow_paths_agree_on_jpeg(tmp_path: Path) -> None:
    path = _jpeg(tmp_path / "a.jpg", 3, (64, 80))
    np.testing.assert_array_equal(decode_rgb(path), np.asarray(open_rgb(path)))


def _corrupt_files(tmp_path: Path) -> list[Path]:
    good = _jpeg(tmp_path / "good.jpg", 0, (64, 64)).read_bytes()
    files = {
        "truncated.jpg": good[: len(good) // 2],
        "no_eoi.jpg": good[:-2],
        "empty.jpg": b"",
        "text.jpg": b"this is not an image",
        "garbage.jpg": good[:200] + bytes(range(256)) * 8,
    }
    out = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        out.append(tmp_path / name)
    return out


def test_corrupt_files_raise_corrupt_image_error(tmp_path: Path) -> None:
    for path in [*_corrupt_files(tmp_path), tmp_path / "vanished.jpg"]:
        with pytest.raises(CorruptImageError) as err:
            decode_rgb(path)
        assert err.value.path == path and isinstance(err.value, DataError)
        with pytest.raises(CorruptImageError):
            open_rgb(path)


# --------------------------------------------------------------------------- dataset + collate


def test_bad_files_become_markers_and_are_dropped_from_batches(tmp_path: Path) -> None:
    bad = _corrupt_files(tmp_path)
    good = [_jpeg(tmp_path / f"g{i}.jpg", i) for i in range(3)]
    items = [Item(p, 0) for p in [good[0], bad[0], good[1], bad[1], good[2]]]
    ds = ImageDataset(items, create_transform(SEED_AUGMENT, 32, train=True, seed=0))
    assert isinstance(ds[1], BadSample) and ds[1].path == str(bad[0])
    batch = collate_skip_bad([ds[i] for i in range(len(ds))])
    assert isinstance(batch, Batch) and isinstance(batch, tuple)
    assert batch.images.shape == (3, 3, 32, 32) and batch.images.dtype == torch.uint8
    assert batch.labels.tolist() == [0, 0, 0]
    assert batch.bad_files == [str(bad[0]), str(bad[1])]


def test_all_bad_batch_is_empty_not_a_crash() -> None:
    batch = collate_skip_bad([BadSample("a.jpg", "x"), BadSample("b.jpg", "y")])
    assert batch.images.shape == (0, 3, 0, 0) and batch.labels.shape == (0,)
    assert batch.bad_files == ["a.jpg", "b.jpg"]


def test_bad_files_found_in_workers_reach_the_main_process(tmp_path: Path) -> None:
    bad = _corrupt_files(tmp_path)
    good = [_jpeg(tmp_path / f"g{i}.jpg", i) for i in range(6)]
    items = [Item(p, i % 2) for i, p in enumerate(good + bad)]
    ds = ImageDataset(items, create_transform(SEED_AUGMENT, 24, train=True))
    loader = torch.utils.data.DataLoader(
        ds, batch_size=3, num_workers=2, collate_fn=collate_skip_bad, shuffle=True
    )
    seen_images, seen_bad = 0, []
    for images, labels, bad_files in loader:  # a full epoch: no crash mid-way
        assert images.shape[0] == labels.shape[0]
        seen_images += images.shape[0]
        seen_bad += bad_files
    assert seen_images == 6 and sorted(seen_bad) == sorted(str(p) for p in bad)


def extraneous_bytes_jpeg(path: Path, seed: int = 0) -> Path:
    """A JPEG with 4 stray bytes after its first header segment: libjpeg decodes it whole and
    prints "Corrupt JPEG data: 4 extraneous bytes before marker 0xdb" to fd 2 itself."""
    good = _jpeg(path, seed).read_bytes()
    end = 4 + int.from_bytes(good[4:6], "big")  # SOI, then the APP0 segment's length
    path.write_bytes(good[:end] + b"\x00\x11\x22\x33" + good[end:])
    return path


def test_libjpeg_warning_is_caught_and_the_file_named(tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    warned = extraneous_bytes_jpeg(tmp_path / "extra.jpg")
    good = [_jpeg(tmp_path / f"g{i}.jpg", i) for i in range(3)]
    ds = ImageDataset([Item(p, 0) for p in [good[0], warned, *good[1:]]],
                      create_transform(None, 24, train=False))
    for workers in (0, 1):  # in this process, and in a worker process (pickled back)
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers,
                                             collate_fn=collate_skip_bad)
        (images, labels, bad), = list(loader)
        assert images.shape[0] == labels.shape[0] == 4  # kept: it decoded whole
        assert bad == [str(warned)] and isinstance(bad[0], WarnedFile)
        assert bad[0].warning.startswith("Corrupt JPEG data: ")
    assert "Corrupt JPEG data" not in "".join(capfd.readouterr())


# --------------------------------------------------------------------------- links and bombs


def test_a_link_out_of_the_image_folder_is_refused(seed_layout: Path, tmp_path: Path) -> None:
    secret = _jpeg(tmp_path.parent / f"{tmp_path.name}-secret" / "secret.jpg")
    (seed_layout / "images" / "cat.link.jpg").symlink_to(secret)
    _csv(seed_layout / "linked.csv", [("cat.link.jpg", "cat"), ("cat.0.jpg", "cat"),
                                      ("dog.0.jpg", "dog")])
    with pytest.raises(DataError, match=r"is a link to .*secret\.jpg, outside the image folder.*"
                                        r"--follow-links"):
        resolve_dataset(csv=seed_layout / "linked.csv", images=seed_layout / "images")
    split = resolve_dataset(csv=seed_layout / "linked.csv", images=seed_layout / "images",
                            val_split=0.0, follow_links=True)
    assert len(split.train) == 3


def test_a_link_inside_the_image_folder_is_fine(seed_layout: Path) -> None:
    (seed_layout / "images" / "cat.alias.jpg").symlink_to(seed_layout / "images" / "cat.1.jpg")
    _csv(seed_layout / "alias.csv", [("cat.alias.jpg", "cat"), ("dog.0.jpg", "dog")])
    split = resolve_dataset(csv=seed_layout / "alias.csv", images=seed_layout / "images",
                            val_split=0.0)
    assert len(split.train) == 2


def test_folder_layout_links_out_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    for c in ("cat", "dog"):
        for i in range(2):
            _jpeg(root / c / f"{c}{i}.jpg", i)
    outside = tmp_path / "elsewhere"
    _jpeg(outside / "x.jpg")
    (root / "cat" / "shadow.jpg").symlink_to(outside / "x.jpg")
    (root / "dog" / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(DataError, match=r"links leading outside it.*shadow\.jpg -> "):
        resolve_dataset(folder=root)
    assert len(resolve_dataset(folder=root, follow_links=True, val_split=0.0).train) >= 5


def _png(path: Path, w: int, h: int) -> Path:
    # A flat 1-bit PNG compresses a huge canvas into a few kilobytes: a decompression bomb.
    Image.new("1", (w, h)).save(path)
    return path


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path: Path,
                                                          recwarn: pytest.WarningsRecorder) -> None:
    bomb = _png(tmp_path / "bomb.png", 12_000, 12_000)
    assert bomb.stat().st_size < 1_000_000
    for decode in (decode_rgb, open_rgb):
        with pytest.raises(CorruptImageError, match=r"12000 x 12000 = 144\.0 MP is above the "
                                                    r"89\.5 MP limit.*--max-image-pixels"):
            decode(bomb)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]


def test_the_pixel_limit_is_configurable(tmp_path: Path) -> None:
    from stepscope.train import data

    img = _png(tmp_path / "wide.png", 3000, 2000)
    try:
        data.set_max_image_pixels(1_000_000)
        with pytest.raises(CorruptImageError, match=r"6\.0 MP is above the 1\.0 MP limit"):
            decode_rgb(img)
        data.set_max_image_pixels(0)  # no limit
        assert decode_rgb(img).shape == (2000, 3000, 3)
    finally:
        data.set_max_image_pixels(data.DEFAULT_MAX_IMAGE_PIXELS)


def test_a_bomb_in_the_dataset_costs_one_image(tmp_path: Path) -> None:
    good = _jpeg(tmp_path / "good.jpg")
    bomb = _png(tmp_path / "bomb.png", 12_000, 12_000)
    ds = ImageDataset([Item(good, 0), Item(bomb, 1)], create_transform(None, 32, train=False))
    batch = collate_skip_bad([ds[0], ds[1]])
    assert batch.images.shape[0] == 1 and batch.bad_files == [str(bomb)]


def test_random_bytes_name_the_file_not_a_buffer(tmp_path: Path) -> None:
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"\x00not an image at all" * 10)
    with pytest.raises(CorruptImageError) as err:
        decode_rgb(junk)
    assert "BytesIO" not in str(err.value) and str(junk) in str(err.value)
