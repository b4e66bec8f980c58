"""A program that kept what epoch 1 read (a tf.data ``.cache()`` after the decode): later epochs
read no files at all, so the disk is idle for another reason than the page cache, and the seed's
inference "after epoch 1 the images are in RAM" is right, in the process's own memory. Each
sentence rests on its measurement: the epochs' reads (``rchar``), and the cache watch read in
the pipeline. Hand-made summaries with only the keys the answers read."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.analysis.explain import cold_vs_warm, ram_inference

pytestmark = pytest.mark.light

MB = 1_000_000


def _summary(later_rchar: int, cache: bool | None = True) -> Any:
    """Epoch 1 read the 20 MB dataset from disk (cold); epochs 2-3 read ``later_rchar`` each,
    none of it from disk (the page cache held the files: 100 % resident)."""
    epochs = [{"epoch": 1, "disk_read_bytes": 26 * MB, "rchar_bytes": 20 * MB},
              *({"epoch": e, "disk_read_bytes": 0, "rchar_bytes": later_rchar} for e in (2, 3))]
    phases = [{"epoch": e, "phase": "train", "dataset_resident_frac_start": r}
              for e, r in ((1, 0.0), (2, 1.0), (3, 1.0))]
    return {"epochs": epochs, "phases": phases,
            "dataset": {"files": 600, "bytes": 20 * MB},
            "loader": {"kind": "tf.data", "cache": cache},
            "memory": {"device": "cpu", "main_rss_bytes": 1_100 * MB}}


def test_no_reads_after_epoch_one_is_the_program_keeping_them() -> None:
    text = cold_vs_warm(_summary(0))[1]  # type: ignore[index]
    assert ("Later epochs did not read the files again: the program kept what epoch 1 read, so "
            "the disk had nothing to do (the tf.data pipeline caches: .cache(), as watch read "
            "the pipeline given to Model.fit, keeps its batches in the training process).") in text
    assert "read every file again" not in text
    text = ram_inference(_summary(0))[1]  # type: ignore[index]
    assert text.startswith("Right, in the training process's own memory. In epoch 3 the program "
                           "read 0 B of files (epoch 1: 20 MB): it kept what it had read (the "
                           "tf.data pipeline caches"), text
    assert "The training process peaked at 1.1 GB; the dataset is 20 MB." in text


def test_without_the_cache_read_the_keeping_is_said_without_how() -> None:
    text = cold_vs_warm(_summary(0, cache=None))[1]  # type: ignore[index]
    assert "the program kept what epoch 1 read, so the disk had nothing to do." in text
    assert "tf.data" not in text
    text = ram_inference(_summary(0, cache=None))[1]  # type: ignore[index]
    assert "it kept what it had read (how, watch did not see)." in text and "tf.data" not in text


def test_epoch_one_answers_say_who_kept_the_files() -> None:
    from stepscope.analysis.epoch_one import _later_reads

    cold = _summary(0)["epochs"][0]
    assert _later_reads(_summary(0), cold).startswith(
        "later epochs read no files: the program kept what it had read (the tf.data pipeline")
    assert _later_reads(_summary(20 * MB), cold) == ("later epochs found its files in the "
                                                     "kernel's page cache")


def test_files_read_again_are_the_page_cache_as_before() -> None:
    text = cold_vs_warm(_summary(20 * MB, cache=False))[1]  # type: ignore[index]
    assert "The program read every file again each epoch, but the kernel's page cache" in text
    assert "kept what" not in text
    text = ram_inference(_summary(20 * MB, cache=False))[1]  # type: ignore[index]
    assert text.startswith("Right about RAM, wrong about whose.")


def test_the_trainers_feature_cache_is_named_where_it_served() -> None:
    s = _summary(0, cache=None)
    s["loader"] = None
    for p in s["phases"]:
        p["feature_cache"] = p["epoch"] > 1
    text = cold_vs_warm(s)[1]  # type: ignore[index]
    assert "the program kept what epoch 1 read, so the disk had nothing to do (the trainer's " \
           "feature cache: the frozen trunk's features, computed once, fact featcache.used)." in text


def test_a_cached_training_input_beside_validation_files_read_again() -> None:
    """Training cached (its later phases read 0 B), validation reading its 4 MB of files every
    epoch from the page cache: each epoch's reads are validation's, and the answers split them."""
    s = _summary(4 * MB)
    s["phases"] = [{"epoch": e, "phase": k, "rank": None, "dataset_resident_frac_start": r,
                    "rchar_bytes": b, "disk_read_rate_bytes_per_s": None}
                   for e, r in ((1, 0.0), (2, 1.0), (3, 1.0))
                   for k, b in (("train", 16 * MB if e == 1 else 0), ("val", 4 * MB))]
    text = cold_vs_warm(s)[1]  # type: ignore[index]
    assert ("Later epochs' training read no files again: the program kept what it had read (the "
            "tf.data pipeline caches") in text
    assert "their validation read its files again, and the kernel's page cache served them" in text
    assert "The program read every file again" not in text
    text = ram_inference(s)[1]  # type: ignore[index]
    assert text.startswith("Right for training, in the training process's own memory"), text
    assert "Validation's files were read again every epoch (4.0 MB in epoch 3, 0 B of it from " \
           "disk): the kernel's page cache kept those." in text
