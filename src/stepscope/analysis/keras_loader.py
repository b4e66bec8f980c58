"""Inside a Keras ImageDataGenerator: per-image stage times and loading-thread busy time.

The watch hook counts, per phase, the seconds in ``load_img`` (read, decode, resize), in the
random transform (``get_random_transform`` + ``apply_transform``) and in ``standardize``
(``preprocessing_function``), the images loaded and each loading thread's time inside
``__getitem__`` (fact ``keras_stages.phase.<id>``). This module turns them into per-image
figures and one answer. With ``use_multiprocessing=True`` each pool process's time inside
``__getitem__`` is the phase's ``loader.worker_busy_s`` (one figure per worker process); with
threads (``use_multiprocessing=False``, ``workers>1``) one per thread, with its CPU time beside
it (``loader.worker_cpu_s``): ``workers_answer`` says how busy each was. Two answers read the
input's own structure instead: validation through an augmenting input (``val_augmented_answer``)
and random augmentation before a tf.data ``.cache()`` (``augments_cached_answer``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stepscope.analysis.contracts_summary import LoaderStages, Summary
from stepscope.analysis.evidence import holds
from stepscope.analysis.fmt import fmt_ms, fmt_pct

STAGE_WORDS = (("load", "loading (read, decode, resize)"),
               ("transform", "the random transform"),
               ("preprocess", "preprocessing_function/standardize"))


def stage_fields(raw: Mapping[str, Any] | None, seconds: float | None) -> LoaderStages | None:
    """Per-image milliseconds per stage and each loading thread's busy share of the phase."""
    if not raw or not raw.get("images"):
        return None
    images = int(raw["images"])
    per_image = {k: 1000.0 * float(raw["stage_s"].get(k, 0.0)) / images for k, _ in STAGE_WORDS}
    busy = [float(b) for b in raw.get("thread_busy_s") or []]
    return {"images": images, "batches": int(raw.get("batches") or 0),
            "ms_per_image": per_image,
            "thread_busy_s": busy,
            "thread_busy_frac": [b / seconds for b in busy] if seconds else []}


def stages_answer(s: Summary) -> tuple[str, str] | None:
    """Where an ImageDataGenerator's time went, for the first train and val phase measured."""
    lines = []
    for kind in ("train", "val"):
        p, st = next(((p, st) for p in s.get("phases") or []
                      if p["phase"] == kind and (st := p.get("loader_stages"))), (None, None))
        if p is None or st is None:
            continue
        parts = ", ".join(f"{words} {fmt_ms(st['ms_per_image'][k] / 1000.0)}"
                          for k, words in STAGE_WORDS)
        text = f"In epoch {p['epoch']} {kind}, per image: {parts}"
        if st["thread_busy_frac"]:
            # tf.data runs a generator's calls on pool threads in turn: the sum is the figure.
            text += (f"; the loader was busy building batches {fmt_pct(sum(st['thread_busy_frac']))}"
                     " of the phase (summed over its threads)")
        lines.append(text + ".")
    if not lines:
        return None
    return ("Inside the ImageDataGenerator",
            " ".join(lines) + " (timed in the loader: load_img, get_random_transform + "
            "apply_transform, standardize, and __getitem__).")


def val_augmented_answer(s: Summary) -> tuple[str, str] | None:
    """Validation through an augmenting input: an ImageDataGenerator with random transforms
    (``flow_from_directory(subset="validation")`` and ``flow_from_dataframe`` with
    ``validation_split`` take the generator's augmentation with them), or a ``tf.data`` pipeline
    whose maps draw random numbers (the augmentation mapped over both datasets). Each validation
    image is then warped at random as the training ones are, so the validation figures move
    from epoch to epoch for the same weights."""
    if not holds(s, "val_augmented"):
        return None
    loader = s.get("loader")
    val = loader.get("val") if loader is not None else None
    if val is not None and val.get("kind") == "tf.data":
        what = ("The tf.data pipeline behind validation_data draws random numbers in its maps "
                "(watch read random ops in the map functions' graphs)")
        fix = ("Map the augmentation over the training dataset alone, or put the random layers "
               "inside the model, where Keras runs them in training only.")
    else:
        what = ("The ImageDataGenerator behind validation_data has random transforms (watch "
                "read its settings)")
        fix = ("Validate through a generator with the rescaling alone (a subset, "
               "subset=\"validation\" with validation_split, keeps its generator's "
               "augmentation: give the plain generator the same validation_split and seed).")
    timed = next((st["ms_per_image"]["transform"] for p in s.get("phases") or []
                  if p["phase"] == "val" and (st := p.get("loader_stages"))), None)
    cost = "" if not timed else (f"; the random transform took {fmt_ms(timed / 1000.0)} of each "
                                 "validation image (timed in the loader)")
    return ("Validation was augmented",
            f"{what}, so every validation image was warped at random, as the training ones "
            "are: the validation loss and accuracy were measured on augmented images and "
            f"change from epoch to epoch for the same weights{cost}. {fix}")


def augments_cached_answer(s: Summary) -> tuple[str, str] | None:
    """Random augmentation mapped before a ``tf.data`` ``.cache()``: the cache keeps what the
    first full pass made, so every later epoch replays epoch 1's augmented images (the order
    of the Keras transfer-learning guide's ``map(augment)`` ... ``.cache()``). With two or more
    training epochs, their paces beside it: epoch 1 ran the maps, the later ones read the
    cache."""
    if not holds(s, "augments_cached"):
        return None
    rows = [p for p in s.get("phases") or [] if p["phase"] == "train" and p.get("images_per_s")]
    first, later = (rows[0], rows[1:]) if rows else (None, [])
    if first is not None and later:
        rates = sorted(float(p["images_per_s"] or 0.0) for p in later)
        span = f"{rates[0]:,.0f}" if len(rates) == 1 else f"{rates[0]:,.0f}–{rates[-1]:,.0f}"
        epochs = (f"epoch {later[0]['epoch']}" if len(later) == 1 else
                  f"epochs {later[0]['epoch']}–{later[-1]['epoch']}")
        what = (f"so {epochs} trained on epoch {first['epoch']}'s augmented images again, the "
                f"same random flips and turns (epoch {first['epoch']}, which ran the maps, "
                f"trained at {float(first['images_per_s'] or 0.0):,.0f} img/s; {epochs}, which "
                f"read the cache, at {span} img/s)")
    else:
        what = "so every epoch after the first would train on its augmented images again"
    loader = s.get("loader") or {}
    given = "given to fit" if loader.get("framework") in ("keras", "tf.keras") \
        else "the loop iterated"
    return ("The augmentation was cached",
            f"The tf.data pipeline {given} draws random numbers in a map before its "
            ".cache() (watch read random ops in the graphs of the maps upstream of the cache): "
            f"the cache keeps what the first pass made, {what}. The augmentation ran once, not "
            "once an epoch. Cache the decoded, resized images and map the augmentation after "
            "the cache (....cache().map(augment, num_parallel_calls=tf.data.AUTOTUNE)"
            ".prefetch(tf.data.AUTOTUNE)), or put the random layers inside the model; each "
            "epoch then pays for its augmentation.")


def workers_answer(s: Summary) -> tuple[str, str] | None:
    """How busy each Keras loading worker (process, or thread without ``use_multiprocessing``)
    was, in the last train and val phase where they were timed (the first epoch also holds
    tracing and the pool's start); for threads, also how much of it they were on a CPU."""
    loop = s.get("loader")
    if loop is None or loop.get("framework") not in ("keras", "tf.keras"):
        return None
    lines, threads = [], False
    for kind in ("train", "val"):
        timed = [(p, row) for p in s.get("phases") or []
                 if p["phase"] == kind and p.get("seconds") and (row := p.get("loader"))
                 and row["worker_busy_s"]]
        if not timed:
            continue
        p, row = timed[-1]
        busy = row["worker_busy_s"]
        shares = ", ".join(fmt_pct(b / p["seconds"]) for b in busy)
        if row.get("worker_threads"):
            threads = True
            cpu = ", ".join(fmt_pct(c / p["seconds"]) for c in row.get("worker_cpu_s") or [])
            lines.append(f"In epoch {p['epoch']} {kind} the {len(busy)} loading threads were "
                         f"busy {shares} of the phase" + (f", on a CPU {cpu} of it" if cpu
                                                          else "") + ".")
        else:
            lines.append(f"In epoch {p['epoch']} {kind} the {len(busy)} worker processes were "
                         f"busy {shares} of the phase.")
    if not lines:
        return None
    if threads:
        return ("Inside the loading threads",
                " ".join(lines) + " (each thread's wall and CPU time inside __getitem__, timed "
                "on that thread; waiting for the GIL or a free core counts as busy, not CPU).")
    return ("Inside the loading worker processes",
            " ".join(lines) + " (each process's wall time inside __getitem__, timed in that "
            "process; waiting there for a free core counts as busy).")
