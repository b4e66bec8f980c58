"""Keras advice names only what the run's loader really is (analysis/vocab.py)."""

from __future__ import annotations

import pytest

from stepscope.analysis.vocab import keras_cpu_fix

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_cpu_fix_names_image_data_generator_only_for_one() -> None:
    idg = keras_cpu_fix({"kind": "ImageDataGenerator", "augments": True}, "train")
    assert "ImageDataGenerator's SciPy warp" in idg
    for kind in ("PyDataset", "tf.data", "generator"):
        fix = keras_cpu_fix({"kind": kind}, "train")
        assert "ImageDataGenerator" not in fix and "SciPy" not in fix, kind
        assert "cheaper" in fix
