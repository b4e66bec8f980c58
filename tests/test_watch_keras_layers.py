"""A Keras model that augments inside itself, as the transfer-learning guide writes it (a
``Sequential`` of ``RandomFlip`` and ``RandomRotation`` after the input), watched on TensorFlow:
the layers are read from the model, and the answers that rest on them say so. Real Keras, in its
own process (keras_known.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_watch_keras import _assert_compute_bound, _assert_keras_words, _run


@pytest.mark.slow
def test_augmentation_layers_in_the_model_are_read_and_named(tmp_path: Path) -> None:
    """Planted: instant batches into convolutions behind the augmentation block (compute-bound,
    as without it); the model's random layers are the guide's two, nested in a Sequential."""
    s = _run(tmp_path, "tensorflow", "pydataset", "0", "conv", "--steps", "16", "--val", "8",
             "--augment-layers")
    _assert_compute_bound(s, 16)
    assert s["model"]["augment_layers"] == ["RandomFlip", "RandomRotation"]
    # validation computes less per image, and the layers Keras skips there are named
    assert ("without the model's augmentation layers (RandomFlip, RandomRotation: Keras runs "
            "them in training only, watch: the model's layers)") in " ".join(s["_printed"].split())
    # epoch 1 traced the train function in its first step: slower, and the warm-up says why
    printed = " ".join(s["_printed"].split())
    assert "Why epoch 1 was slower" in printed and "most of the difference." in printed
    _assert_keras_words(s)
