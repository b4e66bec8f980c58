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
from dataclasses import dataclass, replace
from typing import Any, cast

from stepscope.analysis.contracts_summary import InputFacts, LoaderFacts
from stepscope.analysis.fmt import fmt_bytes

PYTORCH = "pytorch"
KERAS = "keras"
# Hugging Face's Trainer: a PyTorch loop whose DataLoaders, precision and checkpoints are set
# through TrainingArguments, so its fixes name those arguments.
HF = "transformers"
# Lightning's Trainer: a PyTorch loop (the user's DataLoaders) whose precision is its argument.
LIGHTNING = "lightning"
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
    bf16: str                   # how to run in bfloat16 (the compute advice; Keras's its own)
    checkpoint_fix: str         # checkpoint writes that take a material share of the run
    # The PyTorch loader's knobs (a Keras run words its own input: keras_* below).
    workers_change: str = "DataLoader(..., num_workers={n})"
    persistent_change: str = "DataLoader(..., persistent_workers=True)"
    more_workers: str = "raise DataLoader workers {w} → {t} (and prefetch_factor)"
    workers_cause: str = ("the job had cores to spare yet the loop waited: too few DataLoader "
                          "workers (or workers started again every phase)")
    main_process_fix: str = ("the training process does the loader's per-batch work itself: "
                             "move collate into workers (num_workers ≥ 1 runs collate_fn there), "
                             "make collate_fn cheaper, or drop pin_memory if the copy is not "
                             "asynchronous")


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
        bf16="bf16 autocast",
        checkpoint_fix="save only the trainable part (a frozen trunk need not be written each "
                       "epoch), or write in a background thread",
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
        checkpoint_fix="save every N epochs (ModelCheckpoint's save_freq, in batches)",
    ),
    HF: Vocab(
        framework=HF,
        worker="DataLoader worker",
        workers_spare="the Trainer's DataLoader workers had time to spare yet the loop waited: "
                      "too few dataloader_num_workers or too little dataloader_prefetch_factor",
        moderate_wait_fix="more TrainingArguments(dataloader_num_workers=N) or "
                          "dataloader_prefetch_factor would hide it",
        transfer_fix="TrainingArguments(dataloader_pin_memory=True) (its default) so the copies "
                     "can overlap; send uint8 and normalise on the device (4× fewer bytes)",
        overhead_fix="log less often (TrainingArguments(logging_steps=...)) and keep callbacks "
                     "free of per-step work (each .item() is a device sync)",
        bf16="TrainingArguments(bf16=True)",
        checkpoint_fix="save less often (TrainingArguments(save_strategy=\"epoch\", or a larger "
                       "save_steps)), or TrainingArguments(save_only_model=True) where resuming "
                       "needs no optimizer state",
        workers_change="TrainingArguments(dataloader_num_workers={n})",
        persistent_change="TrainingArguments(dataloader_persistent_workers=True)",
        more_workers="raise TrainingArguments(dataloader_num_workers={w} → {t}) (and "
                     "dataloader_prefetch_factor)",
        workers_cause="the job had cores to spare yet the loop waited: too few DataLoader "
                      "workers (TrainingArguments' dataloader_num_workers), or workers started "
                      "again every phase",
        main_process_fix="the training process does the loader's per-batch work itself: "
                         "TrainingArguments(dataloader_num_workers=N) with N ≥ 1 runs the "
                         "data_collator in workers; or make the data_collator cheaper, or "
                         "TrainingArguments(dataloader_pin_memory=False) if the copy is not "
                         "asynchronous",
    ),
}


TABLE[LIGHTNING] = replace(
    TABLE[PYTORCH], framework=LIGHTNING, bf16='Trainer(precision="bf16-mixed")',
    overhead_fix="log less often (Trainer(log_every_n_steps=...), self.log(..., on_step=False)); "
                 "avoid per-step .item()/.cpu() in training_step and in callbacks (each is a "
                 "device sync)",
    checkpoint_fix="write less often (ModelCheckpoint(every_n_epochs=N), or keep fewer: "
                   "save_top_k=1), or ModelCheckpoint(save_weights_only=True) where resuming "
                   "needs no optimizer state")


def framework_of(summary: Mapping[str, Any]) -> str:
    """``keras`` when the watch hook saw Keras run the loop, ``transformers`` a Hugging Face
    ``Trainer``, ``lightning`` a Lightning ``Trainer``, else ``pytorch``."""
    loop = (summary.get("loader") or {}).get("framework")
    return KERAS if loop in ("keras", "tf.keras") else loop if loop in (HF, LIGHTNING) \
        else PYTORCH


def vocab(framework: str | None) -> Vocab:
    return TABLE.get(framework or PYTORCH, TABLE[PYTORCH])


def phase_input(loader: LoaderFacts | None, phase: str) -> LoaderFacts | None:
    """The loader facts a ``phase``'s advice speaks of: validation's own input where watch
    recorded one (a Keras ``fit`` may validate on a PyDataset while it trains on tf.data)."""
    if loader is None or phase != "val":
        return loader
    # the GIL figure is measured per phase, whatever the input: validation's own (a summary
    # written before it was has one figure for the process)
    own = {"python_gil_held_frac": loader["val_python_gil_held_frac"]} \
        if "val_python_gil_held_frac" in loader else {}
    return cast(LoaderFacts, {**loader, **(loader.get("val") or {}), **own})


def input_words(facts: LoaderFacts | InputFacts) -> str | None:
    """One input as watch recorded it, in words: "a PyDataset (Batches) with 1 worker"."""
    kind, n = facts.get("kind"), facts.get("workers")
    if kind == "tf.data":
        calls = int(facts.get("parallel_calls") or 1)
        extra = [w for w, ok in (("prefetch", facts.get("prefetch")),
                                 ("cache", facts.get("cache"))) if ok]
        return (f"a tf.data pipeline with {calls} parallel call{'s' if calls != 1 else ''}"
                + (" and " + " and ".join(extra) if extra else ""))
    if kind == "DataLoader":
        return f"a torch DataLoader with num_workers={n or 0}"
    if kind in ("PyDataset", "ImageDataGenerator"):
        name, n = facts.get("class"), n or 1
        noun = ("worker process" if facts.get("multiprocessing") else "worker thread") \
            + ("" if n == 1 else "es" if facts.get("multiprocessing") else "s")
        return f"a {kind}{f' ({name})' if name and name != kind else ''} with {n} {noun}"
    return {"generator": "a Python generator", "arrays": "NumPy arrays"}.get(str(kind))


def differing_inputs(loader: LoaderFacts | None) -> tuple[str, str] | None:
    """(training's input, validation's) in words, where a Keras ``fit`` used two unlike ones."""
    val = loader.get("val") if loader is not None else None
    if loader is None or not val:
        return None
    train_words, val_words = input_words(loader), input_words(val)
    if train_words is None or val_words is None or train_words == val_words:
        return None
    return train_words, val_words


# Over this share of the GIL probe's samples held, a tf.data map's Python (numpy_function,
# py_function) runs one call at a time whatever num_parallel_calls is: a pipeline planted with
# 80 ms of Python a batch, advised parallel calls at ~2.2x, ran 1.00x as fast with them. Such
# a map read held in 63-88 % of the samples, one hashing (GIL-free) in 0-2 %
# (stepscope_watch_keras_clock).
PYTHON_GIL_HELD_FRAC = 0.3


def python_gil_held(loader: LoaderFacts | InputFacts | None) -> float | None:
    """The share of samples that found the GIL held while a Python op ran, where it is over
    ``PYTHON_GIL_HELD_FRAC``; None otherwise or unmeasured."""
    held = loader.get("python_gil_held_frac") if loader is not None else None
    return held if held is not None and held >= PYTHON_GIL_HELD_FRAC else None


def _tf_data_missing(loader: LoaderFacts, phase: str, cores: int) -> list[tuple[str, str]]:
    """What a tf.data pipeline lacks of the three remedies, as recorded (``_tf_pipeline``: its
    widest map, AUTOTUNE counted as the job's cores; any prefetch; any cache): (what it lacks,
    the remedy in tf.data's API). Python ops that hold the GIL lack a way out of it first:
    more parallel calls would run them one at a time."""
    calls = int(loader.get("parallel_calls") or 1)
    out = []
    held = python_gil_held(loader)
    if held is not None:
        more = f" with num_parallel_calls=tf.data.AUTOTUNE (now {calls})" if calls < cores else ""
        out.append((f"Python ops that hold the GIL (held in {held * 100:.0f} % of the samples "
                    "taken while they ran: more parallel calls would run them one at a time)",
                    "move the map's Python (numpy_function/py_function), which holds the GIL, "
                    "into TensorFlow ops (tf.image, tf.io.decode_*, tf.math), which tf.data runs "
                    f"side by side{more}"))
    elif (serial := loader.get("serial_map")) and cores > 1:
        out.append((f"a map that {serial} with no num_parallel_calls, run one call at a time",
                    f"give the map that {serial} num_parallel_calls=tf.data.AUTOTUNE (tf.data "
                    "runs a map with a stateful op, as Keras's random layers and "
                    "numpy_function are, one call at a time unless told)"))
    elif calls < cores:
        out.append((f"too few parallel calls (now {calls})",
                    f"map(..., num_parallel_calls=tf.data.AUTOTUNE) (now {calls})"))
    if not loader.get("prefetch"):
        out.append(("no prefetch", ".prefetch(tf.data.AUTOTUNE) at the end"))
    if not loader.get("cache"):
        out.append(("no cache", ".cache() after decoding (validation reads the same images "
                    "every epoch)" if phase == "val" else ".cache() after decoding, if the "
                    "decoded set fits in RAM and nothing random comes before it"))
    return out


def _tf_data_has(loader: LoaderFacts) -> str:
    calls = int(loader.get("parallel_calls") or 1)
    has = [f"maps with {calls} parallel call{'s' if calls != 1 else ''}"]
    has += [w for w, ok in (("prefetches", loader.get("prefetch")),
                            ("caches", loader.get("cache"))) if ok]
    return "the tf.data pipeline already " + (", ".join(has[:-1]) + " and " + has[-1]
                                              if len(has) > 1 else has[0])


def keras_checkpoint_fix(how: Mapping[str, Any] | None, then: str | None = None) -> str:
    """ModelCheckpoint's own ways to write less, leaving out those it already uses (``how``:
    watch's fact, None where no ModelCheckpoint was seen), then ``then`` (default: save every N
    epochs; "" for nothing more)."""
    tail = TABLE[KERAS].checkpoint_fix if then is None else then
    ways = [w for w, used in (
        ("save_best_only=True writes only when the monitored figure improves",
         (how or {}).get("save_best_only")),
        ("save_weights_only=True (a .weights.h5 file) leaves out the optimizer's state and "
         "the model's config", (how or {}).get("save_weights_only")))
        if not used]
    if not ways:
        return tail
    return "ModelCheckpoint(" + "; ".join(ways) + ")" + (f", or {tail}" if tail else "")


# fit(x, y) on NumPy arrays: Keras slices them in its own tf.data pipeline; the wait is each
# slice's fetch (~0.15 ms a batch of 32 rows on this CPU), which no worker count changes.
ARRAYS_FIX = ("the batches are slices of NumPy arrays in memory, fetched through Keras's own "
              "tf.data pipeline: what is left is each fetch's own cost, which larger batches "
              "spread over more images (there is no loading to parallelise)")


def keras_moderate_wait_fix(loader: LoaderFacts | None, phase: str, cores: int) -> str:
    """A data wait under the input-bound threshold: what would hide it, in the API of the
    phase's input, leaving out what that input already does."""
    kind = loader.get("kind") if loader is not None else None
    if loader is not None and kind == "tf.data":
        missing = _tf_data_missing(loader, phase, cores)
        if not missing:
            return (_tf_data_has(loader) + ": what is left is each batch's own cost (cheaper "
                    "per-batch work, or larger batches over the same images)")
        return "hide it in the tf.data pipeline: " + "; ".join(m for _, m in missing)
    if loader is not None and kind == "DataLoader":
        return ("more loading workers would hide it: construct the DataLoader with "
                f"num_workers=N (now {loader.get('workers') or 0})")
    if loader is not None and kind in ("PyDataset", "ImageDataGenerator"):
        w = loader.get("workers") or 1
        if loader.get("framework") == "tf.keras":
            return f"more loading workers would hide it: model.fit(..., workers=N) (now {w})"
        return (f"more loading workers would hide it: construct the "
                f"{loader.get('class') or kind} with workers=N (now {w})")
    if kind == "generator":
        return ("a Python generator makes its batches one at a time, in one thread: as a "
                "keras.utils.PyDataset with workers=2 they would be made ahead of the step")
    if kind == "arrays":
        return ARRAYS_FIX
    return vocab(KERAS).moderate_wait_fix


def keras_workers_spare(loader: LoaderFacts | None, phase: str, cores: int) -> str:
    """Cause ``workers`` in the words of the phase's input."""
    head = "the input pipeline had cores to spare yet the loop waited: "
    kind = loader.get("kind") if loader is not None else None
    if loader is not None and kind == "tf.data":
        # a cache is no remedy for a wait with cores to spare: it saves their work
        lacks = [what for what, _ in _tf_data_missing(loader, phase, cores) if what != "no cache"]
        if lacks:
            return head + "the tf.data pipeline has " + " and ".join(lacks)
        # What is left is unmeasured here: the pipeline's per-batch work or the fetch's own cost
        # (a fetch from a full prefetch buffer is ~0.2-0.5 ms a step on a 2-core CPU, README).
        decodes = (", and its map decodes the same image files every epoch with nothing "
                   "caching them" if loader.get("decodes") and loader.get("cache") is False
                   else "")
        return (head + _tf_data_has(loader) + decodes + ", so the loop waits for each batch's "
                "own work or for the fetch itself")
    if loader is not None and kind == "DataLoader":
        return head + f"too few DataLoader workers (num_workers={loader.get('workers') or 0})"
    if loader is not None and kind in ("PyDataset", "ImageDataGenerator"):
        return head + f"too few loading workers (now {loader.get('workers') or 1})"
    if kind == "generator":
        return head + "a Python generator makes its batches one at a time, in one thread"
    if kind == "arrays":
        return head + "the batches are slices of NumPy arrays, so the loop waits for each fetch"
    return vocab(KERAS).workers_spare


def keras_workers_fix(loader: LoaderFacts, workers: int, target: int,
                      phase: str = "train") -> str:
    """Raise the parallelism of the input the Keras run uses, in its own API."""
    kind = loader.get("kind")
    legacy = loader.get("framework") == "tf.keras"
    if kind == "tf.data":
        missing = _tf_data_missing(loader, phase, target)
        if not missing:  # at the job's cores already: a busier pipeline helps no more
            return (_tf_data_has(loader) + ": make each batch cheaper, or make batches larger, "
                    "which spreads the fetch's own cost over more images")
        return "give the tf.data pipeline more parallel work: " + "; ".join(m for _, m in missing)
    if kind == "DataLoader":  # a torch DataLoader given to Keras 3's fit, in its own words
        return (f"construct the DataLoader with num_workers={target} (now {workers}) so "
                "batches are ready when the step asks")
    if kind == "generator":
        return (f"a Python generator runs in one thread: rewrite it as a keras.utils.PyDataset "
                f"(__len__ and __getitem__) with workers={target}, use_multiprocessing=True")
    if kind == "arrays":  # no worker to add: nothing is made, the slices are fetched
        return ARRAYS_FIX
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


def keras_receive_fix(loader: LoaderFacts, workers: int) -> str:
    """Worker processes idle while the loop waited: taking each batch from them is the wait."""
    threads = ("model.fit(..., use_multiprocessing=False)" if loader.get("framework") ==
               "tf.keras" else f"construct the {loader.get('class') or 'PyDataset'} with "
               f"use_multiprocessing=False (workers={workers} threads)")
    return (f"the {workers} worker processes were mostly idle while the loop waited: the wait is "
            "the training process taking each batch from them (Keras sends every batch from a "
            "worker process through a multiprocessing queue, pickled, and unpickles it). Where "
            f"__getitem__ is cheap, as its workers' idle time says, {threads}: threads hand a "
            "batch over without a copy; otherwise send fewer bytes a batch, such as uint8 "
            "images rescaled inside the model by keras.layers.Rescaling(1 / 255), a quarter "
            "of float32's")


# Why a Keras run's loading threads could not keep up, when they were measured GIL-bound.
KERAS_THREADS_GIL = ("the PyDataset's loading threads took turns holding Python's GIL, so the "
                     "job's other cores did no loading")


def keras_cpu_fix(loader: LoaderFacts, phase: str, model_augments: bool = False) -> str:
    """The loading CPU is saturated: make each batch cheaper, or compute it once."""
    if phase == "val" and loader.get("augments"):
        plain = ("map the augmentation over the training dataset alone" if loader.get("kind")
                 == "tf.data" else "validate through a generator with the rescaling alone")
        return ("validation is augmented too (its input draws random transforms): "
                f"{plain}, then decode once and .cache() the resized validation set (tf.data), "
                "or for a frozen trunk compute its features once with base.predict and validate "
                "the head on them")
    if phase == "val":
        # "no augmentation" only where it was read: an ImageDataGenerator's settings, or a
        # tf.data pipeline's map ops with no random op and no opaque Python op
        none = ("validation does no augmentation: its CPU cost is decoding and resizing; "
                if loader.get("augments") is False else
                "validation's CPU cost is loading its images (its input's augmentation was not "
                "read); ")
        return (none + "decode once and .cache() the resized validation set (tf.data), or for "
                "a frozen trunk compute its features once with base.predict and validate the "
                "head on them")
    layers = ("Keras preprocessing layers such as RandomRotation, RandomZoom, RandomFlip run as "
              "compiled ops in a tf.data map with num_parallel_calls=AUTOTUNE or on the GPU "
              "inside the model")
    if loader.get("kind") == "ImageDataGenerator":
        text = ("the CPU preparing images is the limit: make augmentation cheaper (" + layers
                + ", instead of ImageDataGenerator's SciPy warp per channel, ~130 img/s per core)")
    else:  # the run's own loading code: only the generic remedies apply
        text = ("the CPU preparing batches is the limit: make each batch cheaper (whole-batch "
                "NumPy or TensorFlow ops instead of per-item Python; " + layers + ")")
    if loader.get("augments") is False and not model_augments:
        text += ("; nothing is augmented, so for a frozen trunk compute its features once "
                 "with base.predict and train the head on them")
    return text


CACHE_CHANGE = "a .cache() after the decode"


CACHE_RAM_FRAC = 0.5  # a decoded set over half the RAM the run left available: not in memory


def keras_decode_cache_fix(loader: LoaderFacts, images: int | None,
                           available: float | None = None) -> str:
    """A tf.data pipeline whose map decodes image files with no ``.cache()`` (claim
    ``tf_data_decodes``): every epoch decodes the same files again; a cache after the decode
    map keeps the decoded images (``image_bytes`` each) for the epochs after the first, in
    memory where they fit in half of ``available`` (the host's RAM available at its lowest
    during the run), else in a file on a local disk."""
    size = loader.get("image_bytes")
    total = size * images if size and images else None
    head = ("the CPU preparing batches is the limit, and each epoch decodes the same image files "
            "again (the pipeline's map decodes images and nothing caches them; watch: the map "
            "functions' ops): ")
    where = ("right after the decode map (on the dataset image_dataset_from_directory returns, "
             "if that decodes), before any random op")
    if total is not None and available and total > CACHE_RAM_FRAC * available:
        return (head + f"the decoded images would take ~{fmt_bytes(total)} for the {images:,} "
                f"images of an epoch, as the pipeline yields them, more than half the "
                f"{fmt_bytes(available)} of RAM this host had available: .cache(filename) on a "
                f"local disk {where}, or cache them smaller (uint8 before any float conversion, "
                "a smaller size), so epochs after the first skip decoding")
    if total is None:
        held = " (if the decoded set fits in RAM)"
    else:
        room = f", of {fmt_bytes(available)} of RAM available" if available \
            else ": it must fit in RAM"
        held = f" (~{fmt_bytes(total)} for the {images:,} images of an epoch, as the pipeline " \
               f"yields them{room})"
    return (head + f".cache() {where}, keeps the decoded images in memory{held}, so epochs "
            "after the first skip reading and decoding; or make the decode cheaper (smaller "
            "stored images)")


def keras_storage_fix() -> str:
    return ("the input waits on the disk: put the dataset on faster local storage or in RAM, "
            "store smaller pre-resized files, .cache() the decoded set (tf.data) or add "
            "PyDataset workers so more reads are in flight")


# mixed_bfloat16 on a CPU with native bf16 (AMX), per Keras backend, the known-answer conv model
# rerun in it (bench/keras_bf16.py, docs/keras.md): TensorFlow and torch ran faster, JAX slower
# (XLA's CPU backend). Where it was not measured, it is not advised.
KERAS_CPU_BF16_PAYS = {"tensorflow": True, "torch": True, "jax": False}


def keras_bf16_pays(native: bool | None, backend: str | None, device: str | None) -> bool:
    """Whether to advise mixed_bfloat16: the device's bf16 is native (``host.bf16``, as read)
    and, on a CPU, the backend was measured faster in it."""
    if not native:
        return False
    return device != "cpu" or KERAS_CPU_BF16_PAYS.get(backend or "", False)


def keras_compute_fix(bf16_capable: bool | None, tried_bf16: bool, frozen: bool | None,
                      augments: bool | None, frozen_until: str = "",
                      augment_layers: list[str] | tuple[str, ...] = (),
                      augments_cached: bool = False) -> str:
    """What is left for a compute-bound Keras run; ``frozen_until``: the epochs a frozen trunk's
    advice is for, where a later fit trained it (" (epochs 1–2: …)"); ``augment_layers``: the
    model's own random layers, which make every epoch's images new to the trunk;
    ``augments_cached``: the input's augmentation runs before its ``.cache()``, so after
    epoch 1 the trunk sees the same images every epoch."""
    parts = []
    if bf16_capable and not tried_bf16:
        parts.append(TABLE[KERAS].bf16 + " (the CPU has native bf16)")
    parts.append("a larger batch")
    if frozen and augments_cached and not augment_layers:
        parts.append("the input's augmentation runs before its .cache() (watch: random ops "
                     "upstream of it), so after epoch 1 the frozen trunk sees the same images "
                     "every epoch: precompute its features once with base.predict and train "
                     "the head on them, or map the augmentation after the cache so that it "
                     "sees new ones" + frozen_until)
    elif frozen and augments is False:
        parts.append("precompute the frozen trunk's features once with base.predict and train "
                     "the head on them" + frozen_until)
    elif frozen and augment_layers:
        parts.append(f"the model augments each training step ({', '.join(augment_layers)}, "
                     "watch: the model's layers), so the frozen trunk sees new images every "
                     "epoch: augment less, or drop those layers and train the head on "
                     "base.predict features computed once, where accuracy allows" + frozen_until)
    elif frozen:
        parts.append("with the trunk frozen, augment less or cache base.predict features of "
                     "un-augmented images where accuracy allows" + frozen_until)
    return ", ".join(parts)
