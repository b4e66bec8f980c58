"""The words and fixes of each framework: advice speaks the framework the run used.

One table, keyed by framework. ``pytorch`` is the default (``stepscope train``, PyTorch loops
under ``watch``); ``keras`` covers Keras 3 on every backend and tf-keras. The framework is a
fact recorded by the watch hook (``loop.framework``), never guessed from the advice's needs.
What loads a Keras run's data (``loader.kind``: PyDataset, ImageDataGenerator, generator,
tf.data, arrays) picks the Keras fix, so a tf.data run is told about ``num_parallel_calls`` and
a PyDataset run about ``workers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepscope.analysis.contracts_summary import LoaderFacts

PYTORCH = "pytorch"
KERAS = "keras"
# Words a Keras run's explanation, report and findings must never contain.
PYTORCH_ONLY_WORDS = ("DataLoader", "num_workers", "pin_memory", "prefetch_factor", "autocast",
                      "channels_last", "non_blocking", ".item()")


@dataclass(frozen=True)
class Vocab:
    """How one framework names the loader and what it offers as fixes."""

    framework: str
    worker: str                 # one loading worker, singular noun
    workers_spare: str          # cause "workers", as a clause
    moderate_wait_fix: str      # a data wait under the input-bound threshold
    transfer_fix: str
    overhead_fix: str
    bf16: str                   # how to run in bfloat16
    bf16_tried: str             # the same, as already used


TABLE: dict[str, Vocab] = {
    PYTORCH: Vocab(
        framework=PYTORCH,
        worker="DataLoader worker",
        workers_spare="the DataLoader workers had time to spare yet the loop waited: too few "
                      "workers or too little prefetch",
        moderate_wait_fix="more DataLoader workers or prefetch would hide it",
        transfer_fix="pin_memory=True with non_blocking copies; send uint8 and normalise on the "
                     "device (4× fewer bytes than float32)",
        overhead_fix="log and compute metrics every N steps; avoid per-step .item()/.cpu() "
                     "(each is a device sync); move Python work out of the loop",
        bf16="bf16 autocast and channels_last",
        bf16_tried="bf16 autocast",
    ),
    KERAS: Vocab(
        framework=KERAS,
        worker="loading worker",
        workers_spare="the input pipeline had cores to spare yet the loop waited: too few "
                      "PyDataset workers or tf.data parallel calls, or too little prefetch",
        moderate_wait_fix="more PyDataset workers, or tf.data num_parallel_calls=AUTOTUNE and "
                          ".prefetch(tf.data.AUTOTUNE), would hide it",
        transfer_fix="end the tf.data pipeline with .prefetch(tf.data.AUTOTUNE) so the copy "
                     "overlaps the step; send uint8 and rescale inside the model "
                     "(keras.layers.Rescaling), 4× fewer bytes than float32",
        # steps_per_execution is advised only with the callbacks' time measured
        # (findings.keras_steps_per_execution, claim keras_callback_overhead).
        overhead_fix="keep callbacks free of per-batch work (async_safe, no per-batch "
                     "logging); verbose=2 instead of the per-batch progress bar",
        bf16='keras.mixed_precision.set_global_policy("mixed_bfloat16")',
        bf16_tried="mixed_bfloat16",
    ),
}


def framework_of(summary: Mapping[str, Any]) -> str:
    """``keras`` when the watch hook saw Keras run the loop, else ``pytorch``."""
    loop = (summary.get("loader") or {}).get("framework")
    return KERAS if loop in ("keras", "tf.keras") else PYTORCH


def vocab(framework: str | None) -> Vocab:
    return TABLE.get(framework or PYTORCH, TABLE[PYTORCH])


def keras_workers_fix(loader: LoaderFacts, workers: int, target: int) -> str:
    """Raise the parallelism of the input the Keras run uses, in its own API."""
    kind = loader.get("kind")
    legacy = loader.get("framework") == "tf.keras"
    if kind == "tf.data":
        cache = "" if loader.get("cache") else (", .cache() after decoding if the decoded set "
                                                "fits in RAM and nothing random comes before it")
        return ("give the tf.data pipeline parallel work: map(..., num_parallel_calls="
                "tf.data.AUTOTUNE), then .prefetch(tf.data.AUTOTUNE) at the end" + cache)
    if kind == "generator":
        return (f"a Python generator runs in one thread: rewrite it as a keras.utils.PyDataset "
                f"(__len__ and __getitem__) with workers={target}, use_multiprocessing=True")
    if legacy:
        return (f"model.fit(..., workers={target}, use_multiprocessing=True) (now {workers}) so "
                "batches are ready when the step asks")
    return (f"construct the {loader.get('class') or 'PyDataset'} with workers={target}, "
            f"use_multiprocessing=True (now workers={workers}) so batches are ready when the "
            "step asks")


def keras_processes_fix(loader: LoaderFacts, workers: int) -> str:
    """Loading threads that take turns holding the GIL: the same workers as processes."""
    why = (f"(now {workers} threads): its __getitem__ is Python that holds the GIL, so the "
           "threads take turns on one core; processes run it on cores of their own (the "
           "dataset and its batches must pickle)")
    if loader.get("framework") == "tf.keras":
        return f"model.fit(..., workers={workers}, use_multiprocessing=True) {why}"
    return (f"construct the {loader.get('class') or 'PyDataset'} with workers={workers}, "
            f"use_multiprocessing=True {why}")


# Why a Keras run's loading threads could not keep up, when they were measured GIL-bound.
KERAS_THREADS_GIL = ("the PyDataset's loading threads took turns holding Python's GIL, so the "
                     "job's other cores did no loading")


def keras_cpu_fix(loader: LoaderFacts, phase: str) -> str:
    """The loading CPU is saturated: make each batch cheaper, or compute it once."""
    if phase == "val":
        return ("validation does no augmentation: its CPU cost is decoding and resizing; "
                "decode once and .cache() the resized validation set (tf.data), or for a frozen "
                "trunk compute its features once with base.predict and validate the head on them")
    layers = ("Keras preprocessing layers such as RandomRotation, RandomZoom, RandomFlip run as "
              "compiled ops in a tf.data map with num_parallel_calls=AUTOTUNE or on the GPU "
              "inside the model")
    if loader.get("kind") == "ImageDataGenerator":
        text = ("the CPU preparing images is the limit: make augmentation cheaper (" + layers
                + ", instead of ImageDataGenerator's SciPy warp per channel, ~130 img/s per core)")
    else:  # the run's own loading code: only the generic remedies apply
        text = ("the CPU preparing batches is the limit: make each batch cheaper (whole-batch "
                "NumPy or TensorFlow ops instead of per-item Python; " + layers + ")")
    if loader.get("augments") is False:
        text += ("; nothing is augmented, so for a frozen trunk compute its features once "
                 "with base.predict and train the head on them")
    return text


def keras_storage_fix() -> str:
    return ("the input waits on the disk: put the dataset on faster local storage or in RAM, "
            "store smaller pre-resized files, .cache() the decoded set (tf.data) or add "
            "PyDataset workers so more reads are in flight")


def keras_compute_fix(bf16_capable: bool | None, tried_bf16: bool, frozen: bool | None,
                      augments: bool | None) -> str:
    """What is left for a compute-bound Keras run."""
    parts = []
    if bf16_capable and not tried_bf16:
        parts.append(TABLE[KERAS].bf16 + " (the CPU has native bf16)")
    parts.append("a larger batch")
    if frozen and augments is False:
        parts.append("precompute the frozen trunk's features once with base.predict and train "
                     "the head on them")
    elif frozen:
        parts.append("with the trunk frozen, augment less or cache base.predict features of "
                     "un-augmented images where accuracy allows")
    return ", ".join(parts)
