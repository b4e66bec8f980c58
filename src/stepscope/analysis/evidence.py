"""Sentences gated on their evidence: every claim the tool prints declares the measurements it
rests on, as paths into ``summary.json`` with a floor; a claim whose measurement is missing, or
below its floor (too few bytes, samples or steps to mean anything), is not printed.

One mechanism for explain and findings: a claim is a row of :data:`CLAIMS` (its id, the
measurements it needs, in words) and :func:`claim` returns its text only when they hold. Tests
check each row both ways: present with its evidence, absent without.

Examples:
    >>> claim(summary, "page_cache_served", " The files were already in the page cache.")
    ''
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KERAS_CALLS = "loader.train_calls"  # the summary's copy of fact loop.keras_train_calls
DECODE_MIN_MS = 0.05  # a JPEG decode takes ≥ 0.1 ms; below this nothing was decoded


@dataclass(frozen=True)
class Need:
    """A measurement a claim rests on: ``path`` into the summary (``"dataset.files"``,
    ``"by_phase.train.gpu_util_pct"``); present and ≥ ``floor`` when one is given, or equal to
    ``equals`` when that is given."""

    path: str
    floor: float | None = None
    equals: Any = None

    def holds(self, summary: Mapping[str, Any]) -> bool:
        value = lookup(summary, self.path)
        if value is None:
            return False
        if self.equals is not None:
            return bool(value == self.equals)
        if self.floor is None:
            return True
        if isinstance(value, (list, tuple)):
            value = len(value)
        return isinstance(value, (int, float)) and value >= self.floor


# id -> the measurements the sentence rests on. The sentence itself lives where it is printed.
CLAIMS: dict[str, tuple[Need, ...]] = {
    # Claims about the dataset's files (page cache, disk busy then idle, "images in RAM"): only
    # a run whose dataset files are known; an in-memory dataset has none, and its reads are
    # library page-ins.
    "dataset_files": (Need("dataset.files", 1),),
    "page_cache_served": (Need("dataset.files", 1), Need("epochs.0.rchar_bytes", 1)),
    # "none of those physical reads were its files": the dataset's residency measured at the
    # first phase's start and end, both high (the process's disk counter counts every file).
    "disk_reads_not_dataset": (Need("dataset.files", 1),
                               Need("phases.0.dataset_resident_frac_start", 0.9),
                               Need("phases.0.dataset_resident_frac_end", 0.9),
                               Need("epochs.0.disk_read_bytes", 1)),
    # "decoded, resized and normalised on the CPU": the loader's decode stage was timed and took
    # time (a tensor dataset decodes nothing).
    "decoded_train": (Need("by_phase.train.decode_ms_per_image", DECODE_MIN_MS),),
    "decoded_val": (Need("by_phase.val.decode_ms_per_image", DECODE_MIN_MS),),
    # "augmented" / "validation is not augmented": only where the run's configuration says so
    # (the trainer's); a watched script's augmentation is unknown.
    "augmented": (Need("run.augmented", equals=True),),
    # "the GPU idles while it waits": a measured GPU.
    "gpu_idles_waiting": (Need("by_phase.train.gpu_util_pct"),),
    # The fused-warp vs SciPy figures were measured on the seed's augmentation, not any script's.
    "scipy_augment_figures": (Need("run.augment", equals="seed"),),
    # "callbacks take N % of every Keras step: steps_per_execution": watch timed the user's
    # batch callbacks, and they took a material share of the training step.
    "keras_callback_overhead": (Need("loader.callbacks_timed", equals=True),
                                Need("by_phase.train.other_frac", 0.1)),
    # "the graph ran X ms of each Y ms step; the rest is paid once per call": watch timed the
    # TensorFlow graph inside the Keras training steps (loop.keras_train_calls), over enough
    # steady steps for a median.
    "keras_graph_timed": (Need(f"{KERAS_CALLS}.work_median_s"),
                          Need(f"{KERAS_CALLS}.calls", 10)),
    # "other: Keras's per-batch Python and callbacks, the dispatch and return": on a CPU the
    # step's other_s is all the loop did outside TensorFlow's graph (watch timed the graph).
    "keras_other_is_loop": (Need(f"{KERAS_CALLS}.other_is_loop", equals=True),),
    # ... and it took a material share of the training step: steps_per_execution.
    "keras_loop_overhead": (Need(f"{KERAS_CALLS}.other_is_loop", equals=True),
                            Need(f"{KERAS_CALLS}.work_median_s"),
                            Need(f"{KERAS_CALLS}.calls", 10),
                            Need("by_phase.train.other_frac", 0.1)),
    # "TensorBoard 98 % of them": watch timed the user's batch callbacks one class at a time.
    "keras_callbacks_named": (Need(f"{KERAS_CALLS}.callbacks_by"),
                              Need(f"{KERAS_CALLS}.callbacks_s", 1e-6)),
    # "each epoch decodes the same image files again: .cache() after the decode map": watch read
    # an image-decoding op in a map of the tf.data pipeline given to Model.fit, and no cache.
    "tf_data_decodes": (Need("loader.kind", equals="tf.data"), Need("loader.decodes", equals=True),
                        Need("loader.cache", equals=False)),
    # "the tf.data pipeline caches": watch read a .cache() in the pipeline given to Model.fit.
    "tf_data_cache": (Need("loader.kind", equals="tf.data"), Need("loader.cache", equals=True)),
    # "validation was augmented": watch read random transforms set on the ImageDataGenerator
    # behind Model.fit's validation_data (its rotation_range, zoom_range, flips, ...), or random
    # ops in the map functions of its tf.data pipeline.
    "val_augmented": (Need("loader.val.augments", equals=True),),
    "augments_cached": (Need("loader.augments_cached", equals=True),),
    # "ran under tf.distribute MirroredStrategy": watch read the Keras model's strategy.
    "tf_distribute": (Need("loader.distribute_strategy"),),
}


def lookup(summary: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` (list items by index), or None."""
    node: Any = summary
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
        if node is None:
            return None
    return node


def holds(summary: Mapping[str, Any], claim_id: str) -> bool:
    """Do the measurements behind ``claim_id`` exist (and reach their floors)?"""
    return all(need.holds(summary) for need in CLAIMS[claim_id])


def claim(summary: Mapping[str, Any], claim_id: str, text: str) -> str:
    """``text`` when the claim's measurements hold, else ``""``."""
    return text if holds(summary, claim_id) else ""


def rests_on(claim_id: str) -> list[str]:
    """The summary paths a claim rests on, for tests and for the docs."""
    return [need.path for need in CLAIMS[claim_id]]
