"""Keras advice names only what the run's loader really is (analysis/vocab.py)."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.analysis.keras_loader import workers_answer
from stepscope.analysis.vocab import (
    differing_inputs,
    keras_bf16_pays,
    keras_checkpoint_fix,
    keras_compute_fix,
    keras_cpu_fix,
    keras_moderate_wait_fix,
    keras_processes_fix,
    keras_workers_fix,
    keras_workers_spare,
    phase_input,
)

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


TF_DATA = {"framework": "keras", "kind": "tf.data", "workers": 2, "parallel_calls": 2,
           "prefetch": True, "cache": False}
PYDATASET = {"kind": "PyDataset", "class": "Batches", "workers": 1, "multiprocessing": False,
             "parallel_calls": None, "prefetch": None, "cache": None, "augments": None}


def test_validation_advice_reads_the_validation_input() -> None:
    loader: Any = {**TF_DATA, "val": PYDATASET}
    assert phase_input(loader, "train") is loader
    val = phase_input(loader, "val")
    assert val is not None and val["kind"] == "PyDataset" and val["framework"] == "keras"
    assert phase_input({**TF_DATA, "val": None}, "val")["kind"] == "tf.data"  # type: ignore[index]
    assert "construct the Batches with workers=N (now 1)" in keras_moderate_wait_fix(val, "val", 2)


def test_arrays_get_no_workers_to_raise() -> None:
    """fit(x, y) on NumPy arrays: the wait is each slice's fetch; no PyDataset or worker is
    there to raise (tf-keras's arrays read the same)."""
    for arrays in ({"kind": "arrays"}, {"kind": "arrays", "framework": "tf.keras"}):
        for fix in (keras_moderate_wait_fix(arrays, "train", 2),  # type: ignore[arg-type]
                    keras_workers_fix(arrays, 1, 2)):  # type: ignore[arg-type]
            assert fix.startswith("the batches are slices of NumPy arrays in memory"), fix
            assert "workers=" not in fix and "PyDataset" not in fix
        cause = keras_workers_spare(arrays, "train", 2)  # type: ignore[arg-type]
        assert cause.endswith("slices of NumPy arrays, so the loop waits for each fetch")


def test_tf_data_advice_leaves_out_what_the_pipeline_does() -> None:
    loader: Any = TF_DATA
    fix = keras_moderate_wait_fix(loader, "val", 2)
    assert ".cache() after decoding (validation reads the same images" in fix
    assert "prefetch" not in fix and "num_parallel_calls" not in fix  # already there
    bare: Any = {**TF_DATA, "parallel_calls": 1, "prefetch": False}
    fix = keras_moderate_wait_fix(bare, "train", 2)
    assert "num_parallel_calls=tf.data.AUTOTUNE) (now 1)" in fix and ".prefetch(" in fix
    assert "too few parallel calls (now 1) and no prefetch" in keras_workers_spare(bare, "train", 2)
    done: Any = {**TF_DATA, "cache": True}
    assert "already maps with 2 parallel calls, prefetches and caches" in \
        keras_moderate_wait_fix(done, "train", 2)
    for fix in (keras_moderate_wait_fix(done, "train", 2), keras_workers_spare(loader, "train", 2)):
        assert "PyDataset" not in fix


def test_tf_data_python_holding_the_gil_is_the_lack_named_first() -> None:
    held: Any = {**TF_DATA, "parallel_calls": 1, "prefetch": False, "python_gil_held_frac": 0.9}
    words = keras_workers_spare(held, "train", 2)
    assert "Python ops that hold the GIL (held in 90 % of the samples" in words
    assert "too few parallel calls" not in words and "no prefetch" in words
    # at the job's cores already: the GIL is still what the pipeline lacks
    wide: Any = {**held, "parallel_calls": 2, "prefetch": True}
    fix = keras_moderate_wait_fix(wide, "train", 2)
    assert "which holds the GIL" in fix and "num_parallel_calls" not in fix
    assert "GIL" not in keras_workers_spare({**held, "python_gil_held_frac": 0.2}, "train", 2)


def test_unlike_inputs_are_named_only_where_both_were_recorded() -> None:
    loader: Any = {**TF_DATA, "val": PYDATASET}
    assert differing_inputs(loader) == ("a tf.data pipeline with 2 parallel calls and prefetch",
                                        "a PyDataset (Batches) with 1 worker thread")
    assert differing_inputs({**TF_DATA, "val": None}) is None  # type: ignore[typeddict-item]
    assert differing_inputs({**TF_DATA, "val": {**TF_DATA}}) is None  # type: ignore[typeddict-item]
    assert differing_inputs(None) is None


def test_mixed_bfloat16_is_advised_only_on_a_measured_native_bf16_device() -> None:
    said = 'set_global_policy("mixed_bfloat16") (the CPU has native bf16)'
    assert said in keras_compute_fix(True, False, None, None)
    assert said not in keras_compute_fix(None, False, None, None)  # not read: not said
    assert said not in keras_compute_fix(False, False, None, None)
    assert said not in keras_compute_fix(True, True, None, None)  # the model computes in it


def test_mixed_bfloat16_pays_only_where_a_backend_was_measured_faster() -> None:
    assert keras_bf16_pays(True, "tensorflow", "cpu") and keras_bf16_pays(True, "torch", "cpu")
    assert not keras_bf16_pays(True, "jax", "cpu")  # XLA's CPU backend ran it slower
    assert not keras_bf16_pays(True, None, "cpu")  # backend not recorded: not measured
    assert keras_bf16_pays(True, "jax", "cuda:0")  # a GPU's native bf16
    assert not keras_bf16_pays(None, "tensorflow", "cpu")


def test_checkpoint_fix_leaves_out_what_the_model_checkpoint_does() -> None:
    both = keras_checkpoint_fix({"save_best_only": False, "save_weights_only": False})
    assert "save_best_only=True" in both and "save_weights_only=True" in both
    assert "save_freq" in both
    unseen = keras_checkpoint_fix(None)  # saves watch saw, no ModelCheckpoint among callbacks
    assert "save_best_only=True" in unseen and "save_weights_only=True" in unseen
    best = keras_checkpoint_fix({"save_best_only": True, "save_weights_only": False})
    assert "save_best_only" not in best and "save_weights_only=True" in best
    done = keras_checkpoint_fix({"save_best_only": True, "save_weights_only": True})
    assert "save_best_only" not in done and "save_weights_only" not in done
    assert done == "save every N epochs (ModelCheckpoint's save_freq, in batches)"


def test_validation_through_an_augmenting_generator_is_told_so() -> None:
    """flow_from_directory(subset="validation") from an ImageDataGenerator with random
    transforms (watch: the validation input's augments): validation was augmented. The answer
    names the timed transform where it was timed, and is gone without the fact; the validation
    cpu fix stops saying "validation does no augmentation"."""
    from stepscope.analysis.keras_loader import val_augmented_answer

    stages = {"images": 96, "batches": 6, "ms_per_image": {"load": 1.1, "transform": 1.1,
                                                           "preprocess": 0.01},
              "thread_busy_s": [], "thread_busy_frac": []}
    s: Any = {"loader": {"framework": "tf.keras", "kind": "ImageDataGenerator", "augments": True,
                         "val": {"kind": "ImageDataGenerator", "augments": True}},
              "phases": [{"epoch": 1, "phase": "val", "loader_stages": stages}]}
    got = val_augmented_answer(s)
    assert got is not None and got[0] == "Validation was augmented"
    assert "the random transform took 1.1 ms of each validation image" in got[1]
    s["phases"] = []
    got = val_augmented_answer(s)
    assert got is not None and "random transform took" not in got[1]
    s["loader"]["val"]["augments"] = False
    assert val_augmented_answer(s) is None
    assert keras_cpu_fix({"kind": "ImageDataGenerator", "augments": True}, "val").startswith(
        "validation is augmented too")
    assert keras_cpu_fix({"kind": "ImageDataGenerator", "augments": False}, "val").startswith(
        "validation does no augmentation")
    # a PyDataset's own __getitem__ is not read: no claim either way
    assert keras_cpu_fix({"kind": "PyDataset", "augments": None}, "val").startswith(
        "validation's CPU cost is loading its images (its input's augmentation was not read)")


def test_a_tf_data_validation_that_augments_is_told_to_map_training_alone() -> None:
    from stepscope.analysis.keras_loader import val_augmented_answer

    s: Any = {"loader": {"framework": "keras", "kind": "tf.data", "augments": True,
                         "val": {"kind": "tf.data", "augments": True}}, "phases": []}
    got = val_augmented_answer(s)
    assert got is not None and got[1].startswith(
        "The tf.data pipeline behind validation_data draws random numbers in its maps")
    assert got[1].endswith("Map the augmentation over the training dataset alone, or put the "
                           "random layers inside the model, where Keras runs them in training "
                           "only.")
    assert keras_cpu_fix({"kind": "tf.data", "augments": True}, "val").startswith(
        "validation is augmented too (its input draws random transforms): map the augmentation "
        "over the training dataset alone")


def test_augmentation_mapped_before_the_cache_is_told_it_ran_once() -> None:
    """Random ops in a map before the tf.data pipeline's .cache() (watch:
    loader.augments_cached): later epochs replay epoch 1's augmented images. The answer sets the
    epoch that ran the maps against those that read the cache where their paces were measured,
    says "would" without them, and is gone without the fact (or with it false)."""
    from stepscope.analysis.keras_loader import augments_cached_answer

    rows = [{"epoch": e, "phase": "train", "images_per_s": r}
            for e, r in ((1, 410.0), (2, 2950.0), (3, 3120.0))]
    s: Any = {"loader": {"framework": "keras", "kind": "tf.data", "cache": True,
                         "augments": True, "augments_cached": True}, "phases": rows}
    got = augments_cached_answer(s)
    assert got is not None and got[0] == "The augmentation was cached"
    assert ("so epochs 2–3 trained on epoch 1's augmented images again, the same random flips "
            "and turns (epoch 1, which ran the maps, trained at 410 img/s; epochs 2–3, which "
            "read the cache, at 2,950–3,120 img/s)") in got[1]
    assert "watch read random ops in the graphs of the maps upstream of the cache" in got[1]
    s["phases"] = rows[:1]
    got = augments_cached_answer(s)
    assert got is not None and "would train on its augmented images again" in got[1]
    assert "img/s" not in got[1]
    s["loader"]["framework"] = "tensorflow"  # a hand-written loop over the pipeline
    got = augments_cached_answer(s)
    assert got is not None and "The tf.data pipeline the loop iterated draws" in got[1]
    s["loader"]["augments_cached"] = False
    assert augments_cached_answer(s) is None
    del s["loader"]["augments_cached"]
    assert augments_cached_answer(s) is None


def test_a_frozen_trunk_fed_cached_augmentation_is_told_its_features_repeat() -> None:
    """Augmentation before the input's .cache(): after epoch 1 the frozen trunk sees the same
    images every epoch, so its features can be computed once (or the augmentation moved after
    the cache); without the fact, the advice for an augmenting input stays."""
    said = "so after epoch 1 the frozen trunk sees the same images every epoch"
    assert said in keras_compute_fix(None, False, True, True, augments_cached=True)
    assert said not in keras_compute_fix(None, False, True, True)
    assert said not in keras_compute_fix(None, False, False, True, augments_cached=True)
    # the model's own random layers augment every step whatever the input caches
    assert said not in keras_compute_fix(None, False, True, True, augment_layers=["RandomFlip"],
                                         augments_cached=True)
