"""Keras advice names only what the run's loader really is (analysis/vocab.py)."""

from __future__ import annotations

import pytest

from stepscope.analysis.keras_loader import workers_answer
from stepscope.analysis.vocab import keras_cpu_fix, keras_processes_fix

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_cpu_fix_names_image_data_generator_only_for_one() -> None:
    idg = keras_cpu_fix({"kind": "ImageDataGenerator", "augments": True}, "train")
    assert "ImageDataGenerator's SciPy warp" in idg
    for kind in ("PyDataset", "tf.data", "generator"):
        fix = keras_cpu_fix({"kind": kind}, "train")
        assert "ImageDataGenerator" not in fix and "SciPy" not in fix, kind
        assert "cheaper" in fix


def test_worker_processes_answer_needs_their_busy_time() -> None:
    phases = [{"phase": "train", "epoch": e, "seconds": 2.0,
               "loader": {"worker_busy_s": [1.9, 1.7]}} for e in (1, 2)]
    s = {"loader": {"framework": "keras"}, "phases": phases}
    got = workers_answer(s)
    assert got is not None
    assert "In epoch 2 train the 2 worker processes were busy 95 %, 85 % of the phase" in got[1]
    assert "inside __getitem__" in got[1]
    untimed = [{**p, "loader": {"worker_busy_s": []}} for p in phases]
    assert workers_answer({**s, "phases": untimed}) is None
    assert workers_answer({**s, "loader": {"framework": None}}) is None  # a DataLoader run


def test_worker_threads_answer_names_their_cpu_beside_their_wall() -> None:
    phases = [{"phase": "train", "epoch": 2, "seconds": 2.0,
               "loader": {"worker_busy_s": [1.9, 1.8], "worker_cpu_s": [0.6, 0.5],
                          "worker_threads": True}}]
    got = workers_answer({"loader": {"framework": "keras"}, "phases": phases})
    assert got is not None and got[0] == "Inside the loading threads"
    assert "the 2 loading threads were busy 95 %, 90 % of the phase, on a CPU 30 %, 25 %" in got[1]
    assert "waiting for the GIL" in got[1]


def test_processes_fix_speaks_the_runs_keras() -> None:
    fix = keras_processes_fix({"kind": "PyDataset", "class": "Batches"}, 2)
    assert "construct the Batches with workers=2, use_multiprocessing=True (now 2 threads)" in fix
    legacy = keras_processes_fix({"kind": "PyDataset", "framework": "tf.keras"}, 3)
    assert legacy.startswith("model.fit(..., workers=3, use_multiprocessing=True)")
