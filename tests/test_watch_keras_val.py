"""Validation through an augmenting input, watched: the Keras 2 tutorials' validation_split with
one augmenting ImageDataGenerator on tf-keras (the validation subset keeps the generator's
random transforms), and the Keras guide's tf.data pipeline with its augmentation mapped over the
validation dataset too (Keras 3 on TensorFlow). The answer says validation was augmented; the
same scripts validating on plain input get no such answer. Real frameworks, each in its own
process, real JPEG files (keras_val_subset.py, keras_folder.py). And validation from arrays in
memory, where the seed's "straight to the GPU" is right (keras_known.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_watch_keras import FOLDER_SCRIPT, SCRIPT, _run_script, class_folders


@pytest.mark.slow
@pytest.mark.parametrize("plain_val", [False, True])
def test_validation_through_the_augmenting_generator_is_told(
        synth400: Path, tmp_path: Path, plain_val: bool) -> None:
    folder = class_folders(synth400, "train", tmp_path / "train")
    args = [str(folder), *(["--plain-val"] if plain_val else [])]
    s = _run_script(tmp_path / "watch", SCRIPT.parent / "keras_val_subset.py", *args)
    assert s["loader"]["kind"] == "ImageDataGenerator" and s["loader"]["augments"] is True
    assert s["loader"]["val"]["augments"] is (not plain_val)
    printed = " ".join(s["_printed"].split())
    transform = {(p["phase"], p["epoch"]): p["loader_stages"]["ms_per_image"]["transform"]
                 for p in s["phases"] if p.get("loader_stages")}
    val_transform = [ms for (phase, _), ms in sorted(transform.items()) if phase == "val"]
    if plain_val:
        assert "Validation was augmented" not in printed
        # no random transform to run: the plain generator's transform calls return the image
        # as it is (~0.03 ms an image idle, 0.05 under CI's load), where the same epoch's
        # training warps it (~0.4 ms); held against that warp, timed in the same run, so a
        # loaded host slows both sides alike
        assert val_transform
        for (phase, epoch), ms in transform.items():
            if phase == "val":
                assert ms < transform[("train", epoch)] / 4, (epoch, transform)
        assert "Right for this run" not in printed  # it reads and decodes JPEG files
    else:
        assert "Validation was augmented" in printed
        assert "the validation loss and accuracy were measured on augmented images" in printed
        assert val_transform and val_transform[0] > 0.1  # the planted warp, timed


@pytest.mark.slow
@pytest.mark.parametrize("augment_val", [True, False])
def test_a_tf_data_augmentation_mapped_over_validation_is_told(
        synth400: Path, tmp_path: Path, augment_val: bool) -> None:
    from stepscope.analysis.vocab import PYTORCH_ONLY_WORDS

    folders = tmp_path / "folders"  # DIR/train and DIR/valid, one folder per class
    for split in ("train", "valid"):
        class_folders(synth400, split, folders / split)
    args = [str(folders), "--epochs", "1", *(["--augment-val"] if augment_val else [])]
    s = _run_script(tmp_path / "watch", FOLDER_SCRIPT, *args)
    # the training map's RandomFlip and RandomRotation are random ops in its graph
    assert s["loader"]["kind"] == "tf.data" and s["loader"]["augments"] is True
    assert s["loader"]["val"]["kind"] == "tf.data"
    # image_dataset_from_directory's own maps (read a file, decode, resize) draw no random
    # number and hold no Python: read, the plain validation input is not augmented
    assert s["loader"]["val"]["augments"] is augment_val
    assert s["loader"]["val"]["decodes"] is True
    printed = " ".join(s["_printed"].split())
    assert ("Validation was augmented The tf.data pipeline behind validation_data draws random "
            "numbers in its maps" in printed) is augment_val
    for word in PYTORCH_ONLY_WORDS:
        assert word not in printed, word
    # validation decodes its JPEGs in tf.data's threads, where no decode is timed: the files
    # its phase read say its batches do not come straight from memory
    assert "Right for this run" not in printed


@pytest.mark.slow
def test_validation_sliced_from_arrays_in_memory_is_right(tmp_path: Path) -> None:
    """Planted: a Keras fit on NumPy arrays with validation arrays beside them, nothing to load
    or decode; the seed's "validation passes batches straight to the GPU" holds there."""
    s = _run_script(tmp_path / "watch", SCRIPT, "tensorflow", "arrays", "0", "dense",
                    "--steps", "8", "--val", "8", "--batch", "32", "--epochs", "2")
    printed = " ".join(s["_printed"].split())
    assert "Inference checked: \"validation passes batches straight to the GPU\" Right for this " \
           "run: validation read" in printed, printed[-3000:]
    assert "Half right" not in printed
