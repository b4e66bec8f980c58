"""Keras 3 on TensorFlow with XLA: ``jit_compile="auto"`` (the default) compiles the train step
with XLA wherever TensorFlow sees a GPU, so the seed's user on a GPU trains that way. Keras then
runs the step as an XLA function called from the train function, where the batch is still
fetched: the fetch clock must stay outside the compiled step, and the wait stay true. Planted
on the CPU with ``jit_compile=True``. Real Keras, in its own process (keras_known.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_watch_keras import _assert_input_bound, _assert_keras_words, _run


@pytest.mark.slow
def test_an_xla_compiled_step_fed_by_tf_data_is_input_bound(tmp_path: Path) -> None:
    """Planted: 150 ms of CPU a batch in a tf.data map's Python, a tiny Dense net compiled by
    XLA: input-bound, ~all of each step waiting, one loading thread (``workers``)."""
    s = _run(tmp_path, "tensorflow", "tfdata", "150", "dense", "--steps", "16", "--jit")
    _assert_input_bound(s, 16)
    _assert_keras_words(s)
    # no JAX in this process: its start is no ledger item (tests/test_watch_keras_jax.py)
    assert not any(i["item"].startswith("JAX") for i in s["memory"]["ledger"])
