"""A Keras pipeline that reads image files and caches them after decoding, watched from a cold
page cache: epoch 1 reads the files from disk, later epochs read none, and the answers say the
program kept them (the tf.data cache watch read), not the kernel. Real Keras on TensorFlow in
its own process; real files, evicted first (the plant)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import evict_or_skip
from tests.test_watch_keras import SCRIPT, _run_script, class_folders


@pytest.mark.slow
def test_a_cached_pipeline_keeps_the_files_in_the_process(synth400: Path, tmp_path: Path) -> None:
    folder = class_folders(synth400, "train", tmp_path / "train")
    evict_or_skip(sorted(folder.rglob("*.jpg")))
    s = _run_script(tmp_path / "watch", SCRIPT.parent / "keras_dir_cache.py", str(folder))
    assert s["loader"]["kind"] == "tf.data" and s["loader"]["cache"] is True
    epochs = s["epochs"]
    assert len(epochs) == 3
    assert epochs[0]["disk_read_bytes"] >= 0.8 * s["dataset"]["bytes"]  # cold, as planted
    printed = " ".join(s["_printed"].split())
    assert "Later epochs did not read the files again: the program kept what epoch 1 read" in printed
    assert "The program read every file again" not in printed
    assert "Right, in the training process's own memory." in printed
    assert "Right about RAM, wrong about whose" not in printed
    assert "found its files in the kernel's page cache" not in printed
