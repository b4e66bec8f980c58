"""Keras 3 on JAX, watched: JAX starts its runtime at first use, after the import the baseline
is read at, so the memory ledger names that start rather than calling it the model's objects.
Real Keras on JAX, in its own process (keras_known.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_watch_keras import _assert_input_bound, _assert_keras_words, _run

MB = 1 << 20


@pytest.mark.slow
def test_jax_starting_is_its_own_ledger_item_not_the_models(tmp_path: Path) -> None:
    """Planted: a Dense net of 305 weights (1.2 kB) fed 150 ms a batch by a PyDataset, so
    input-bound; JAX's client, MLIR context and first compile start as Keras makes the first
    weight (~30 MB of RSS on this CPU, measured apart: at least 10 MB here)."""
    s = _run(tmp_path, "jax", "pydataset", "150", "dense", "--steps", "16")
    _assert_input_bound(s, 16)
    _assert_keras_words(s)
    ledger = {i["item"]: i for i in s["memory"]["ledger"]}
    start = ledger["JAX starting: client, MLIR context, first compile"]
    assert start["bytes"] >= 10 * MB, start
    assert "xla_bridge.backends" in start["how_measured"]
    assert ledger["weights"]["bytes"] < 2000
    objects = ledger["model objects beyond the weights"]
    assert "JAX's start (named apart)" in objects["how_measured"], objects
    # Keras built the weights and the optimizer with eager ops, each compiled by XLA at its
    # first call: those compiles are named, not the model's objects (51 MB of "model objects"
    # for this 1.2 kB net before, ~11 MB now: the PyDataset, layers and Keras's own state)
    compiles = ledger["JAX's compiled eager ops before fit()"]
    assert compiles["bytes"] >= 5 * MB and "XLA compiles" in compiles["how_measured"], compiles
    assert objects["bytes"] < 25 * MB, objects
    # the ledger still adds up to the measured total
    m = s["memory"]
    assert sum(i["bytes"] for i in m["ledger"]) + m["unattributed_bytes"] == m["total_bytes"]
