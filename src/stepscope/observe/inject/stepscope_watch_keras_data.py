"""What feeds a Keras loop, read from the ``fit``/``evaluate``/``predict`` call.

``describe_input`` names the input kind and its parallelism, and sends them as ``loader.*``
facts (the first time per phase kind): the advice speaks of what the script really uses.
``loop_sizes`` gives the images per batch where the batches themselves cannot be counted.

A phase's ``workers`` figure is the number of threads or processes that produce batches:
``PyDataset(workers=N)`` → N (threads, or processes with ``use_multiprocessing``), tf.data →
its widest ``map`` (AUTOTUNE counts as the job's cores), a generator → 1 (it runs in one
thread), arrays → none (slicing an array is not loading). Standard library only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder

ImagesFn = Callable[[int, int], int]
# ImageDataGenerator settings that make every epoch's images different (augmentation).
AUGMENT_ATTRS = ("rotation_range", "width_shift_range", "height_shift_range", "shear_range",
                 "zoom_range", "channel_shift_range", "horizontal_flip", "vertical_flip",
                 "brightness_range", "preprocessing_function")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# Python inside a tf.data map: its body's ops cannot be read, so "no random op" says nothing.
OPAQUE_OPS = frozenset({"PyFunc", "EagerPyFunc", "PyFuncStateless"})
# Image decodes in a tf.data map: the files decoded again every epoch unless a .cache() follows.
DECODE_OPS = frozenset({"DecodeJpeg", "DecodePng", "DecodeImage", "DecodeBmp", "DecodeGif",
                        "DecodeAndCropJpeg", "DecodeWebP"})


def _map_ops(ds: Any) -> set[str]:
    """The op types in a ``tf.data`` pipeline's map functions (their graphs, and the functions
    they call): ``*Random*`` ops (``tf.image.random_*``, Keras's random layers) are augmentation,
    ``DECODE_OPS`` decode image files. A ``py_function``/``numpy_function`` body is opaque. Each
    map's graph is serialised once (``_func_ops``)."""
    found: set[str] = set()
    for d in _chain(ds):
        found |= _func_ops(d)
    return found


def _func_ops(d: Any) -> frozenset[str]:
    """The op types of one dataset's map function and the functions it calls; empty for a
    dataset that maps nothing, or another TensorFlow. Kept on the dataset: its graph is
    serialised once, however often it is asked (``describe_input`` reads a map three ways, and
    a hand-written loop classifies each iterator it makes)."""
    known: frozenset[str] | None = getattr(d, "_stepscope_ops", None)
    if known is None:
        known = _read_func_ops(d)
        with contextlib.suppress(Exception):  # one that takes no attribute: read again
            d._stepscope_ops = known
    return known


def _read_func_ops(d: Any) -> frozenset[str]:
    func = getattr(d, "_map_func", None)
    if func is None:
        return frozenset()
    try:
        graph = func.function.graph
        found = {op.type for op in graph.get_operations()}
        for fn in graph.as_graph_def().library.function:
            found |= {n.op for n in fn.node_def}
        return frozenset(found)
    except Exception:  # another TensorFlow: not read
        return frozenset()


def _draws_random(ops: AbstractSet[str]) -> bool:
    """A random op among ``ops`` (``tf.image.random_*``, Keras's random layers): augmentation."""
    return any("Random" in t for t in ops)


# What makes a map the costly stage of an image pipeline, by its op types, in the words the
# advice uses. A map of a cast or a rescale costs next to nothing: run one call at a time, it
# is not what the pipeline waits for, so only these mark a serial map as the narrowest stage.
IMAGE_WORK = (("Random", "draws random numbers (augmentation)"), ("Decode", "decodes images"),
              ("Resize", "resizes images"), ("ImageProjectiveTransform", "warps images"),
              ("CropAndResize", "crops and resizes images"), ("Adjust", "adjusts colours"),
              ("PyFunc", "runs Python (py_function/numpy_function)"))


def _image_work(ops: AbstractSet[str]) -> str | None:
    """What a map's ops do to images (``IMAGE_WORK``'s words), None for light work."""
    return next((words for mark, words in IMAGE_WORK if any(mark in t for t in ops)), None)


CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})  # their bodies are read


def _serial_map(d: Any) -> tuple[str | None, bool]:
    """(what a map given no ``num_parallel_calls`` does to images, None for light work;
    whether it runs one call at a time). tf.data's default rewrite (``map_parallelization``)
    runs a stateless map's calls side by side (a serial resize map used 1.86 of 2 cores, as
    fast as at AUTOTUNE), not one with a stateful op (Keras's random layers read and write their
    seed's variable, ``tf.image.random_*`` draw from a stateful generator, a ``numpy_function``
    is stateful: serially 1.13 cores, 1.55x as fast at AUTOTUNE; probes of 2026-12-06,
    docs/keras.md), nor any map where the options turn the rewrite off."""
    ops = _func_ops(d)
    work = _image_work(ops)
    if work is None:
        return None, False
    try:
        from tensorflow.python.framework import op_def_registry

        stateful = any(od.is_stateful for t in ops - CALL_OPS
                       if (od := op_def_registry.get(t)) is not None)
        rewrite = d.options().experimental_optimization.map_parallelization is not False
    except Exception:  # another TensorFlow: read as written, one call at a time
        return work, True
    return work, stateful or not rewrite


def _augments_cached(ds: Any) -> bool | None:
    """Whether a map before the pipeline's last ``.cache()`` draws random numbers: the cache
    keeps what the first full pass made, so every later epoch replays epoch 1's augmented
    images. False where every map before it was read and none draws one; None where one runs
    Python (its body cannot be read) or there is no cache."""
    cache = next((d for d in _chain(ds) if "Cache" in type(d).__name__), None)
    if cache is None:
        return None
    ops = _map_ops(getattr(cache, "_input_dataset", None))
    if _draws_random(ops):
        return True
    return None if ops & OPAQUE_OPS else False


def _image_bytes(ds: Any) -> int | None:
    """Bytes of one image as the pipeline yields it: its first tensor's shape past the batch
    dimension (``[None, 96, 96, 3]`` float32: 110,592), None where a dimension is unknown."""
    try:
        import tensorflow as tf

        spec = tf.nest.flatten(ds.element_spec)[0]
        return _spec_bytes(spec, batched=True) if spec.shape.rank == 4 else None
    except Exception:
        return None


def _spec_bytes(spec: Any, batched: bool) -> int | None:
    """Bytes of one element of a tensor spec (past its first dimension when ``batched``), None
    where a dimension is known only at run time."""
    dims = spec.shape.as_list()
    n = 1
    for d in dims[1:] if batched and dims else dims:
        if d is None:
            return None
        n *= d
    return int(n * spec.dtype.size)


def _chain(ds: Any) -> Iterator[Any]:
    """A ``tf.data`` pipeline's datasets, last first, down its ``_input_dataset`` links."""
    depth = 0
    while ds is not None and depth < 64:
        yield ds
        ds = getattr(ds, "_input_dataset", None)
        depth += 1


# free-form: the loader.* facts this module writes and the user's fit() keyword arguments
def _tf_pipeline(ds: Any) -> dict[str, Any]:
    """Walk a ``tf.data`` pipeline's Python objects: widest map, prefetch, cache, and a map
    that does image work (``IMAGE_WORK``) one call at a time (``_serial_map``), the last such
    before the model. That map makes the pipeline's batches one at a time however
    wide the maps before it are (``image_dataset_from_directory``'s decode runs at AUTOTUNE, the
    Keras transfer-learning guide's augmentation map after it runs serially), so the loading
    workers are 1 there."""
    parallel, prefetch, cache, held, serial = 1, False, False, None, None
    for d in _chain(ds):
        name = type(d).__name__
        calls = getattr(d, "_num_parallel_calls", None)
        if calls is not None:
            try:
                n = int(calls.numpy()) if hasattr(calls, "numpy") else int(calls)
            except (TypeError, ValueError):
                n = 1
            parallel = max(parallel, _cores() if n < 0 else n)
        elif getattr(d, "_map_func", None) is not None:
            work, one_at_a_time = _serial_map(d)
            if work is not None and not one_at_a_time:  # tf.data runs it at AUTOTUNE
                parallel = max(parallel, _cores())
            elif work is not None and serial is None:
                serial = work
        prefetch = prefetch or "Prefetch" in name
        if "Cache" in name and not cache:
            cache, held = True, _in_memory_bytes(d)
    # where the cache is in memory and its shapes are known: what one image takes there
    sized = {} if held is None else {"cache_bytes_per_image": held}
    serially = {} if serial is None else {"serial_map": serial}
    return {"kind": "tf.data", "workers": 1 if serial else parallel, "parallel_calls": parallel,
            "prefetch": prefetch, "cache": cache, **sized, **serially}


def _in_memory_bytes(cache: Any) -> int | None:
    """Bytes one image takes in a ``.cache()`` held in memory (no file name given): its element
    spec's tensors, past the batch dimension where a ``batch`` comes before the cache. None for
    a cache on disk, or a shape not known until run time."""
    try:
        name = getattr(cache, "_filename", None)
        if name is not None and hasattr(name, "numpy") and name.numpy():
            return None  # .cache(filename): on disk, not in the process's memory
        import tensorflow as tf

        batched = any("Batch" in type(d).__name__
                      for d in _chain(getattr(cache, "_input_dataset", None)))
        sizes = [_spec_bytes(spec, batched) for spec in tf.nest.flatten(cache.element_spec)]
        return None if any(n is None for n in sizes) else sum(n or 0 for n in sizes)
    except Exception:
        return None


def _is_tf_data(x: Any) -> bool:
    """A ``tf.data`` dataset (any of its Python classes), told without importing TensorFlow."""
    return type(x).__module__.startswith("tensorflow.python.data")


def _augments(x: Any) -> bool | None:
    gen = getattr(x, "image_data_generator", None)
    if gen is None:
        return None
    for attr in AUGMENT_ATTRS:
        value = getattr(gen, attr, None)
        if attr == "brightness_range":
            if value is not None:
                return True
        elif isinstance(value, (list, tuple)):
            if any(v not in (0, 1, 1.0, 0.0) for v in value):
                return True
        elif value:
            return True
    return False


# Keras's augmentation layers: random ones are active in training only (``training=True``).
_AUGMENT_LAYER_NAMES = {"RandAugment", "AugMix", "MixUp", "CutMix"}


def augment_layers(model: Any) -> list[str] | None:
    """The class names of the random augmentation layers inside ``model`` (nested models and
    ``Sequential`` blocks included), sorted, each once: the Keras guides augment inside the
    model (``RandomFlip``, ``RandomRotation``...), so each training step runs them. None where
    the layers could not be read."""
    found: set[str] = set()

    def walk(m: Any, depth: int) -> None:
        for layer in getattr(m, "layers", None) or []:
            name = type(layer).__name__
            if name.startswith("Random") or name in _AUGMENT_LAYER_NAMES:
                found.add(name)
            elif depth < 8:
                walk(layer, depth + 1)

    try:
        walk(model, 0)
    except Exception:  # a layer whose attributes raise: not read
        return None
    return sorted(found)


def classify(x: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The kind of input ``x`` and how many threads or processes produce its batches."""
    if x is None:
        return {}
    if _is_tf_data(x):
        return _tf_pipeline(x)
    if type(x).__module__.startswith("torch.utils.data") and hasattr(x, "num_workers"):
        # Keras 3 takes a torch DataLoader as it is (its workers are processes)
        n = int(x.num_workers or 0)
        return {"kind": "DataLoader", "class": type(x).__name__, "workers": n,
                "multiprocessing": n > 0}
    if hasattr(x, "__getitem__") and hasattr(x, "__len__") and hasattr(x, "on_epoch_end"):
        # Keras 3 PyDataset (and legacy ImageDataGenerator iterators) carry their workers;
        # tf-keras Sequences take them from fit(workers=, use_multiprocessing=).
        workers = getattr(x, "workers", None) or call.get("workers") or 1
        mp = getattr(x, "use_multiprocessing", None)
        if mp is None:
            mp = bool(call.get("use_multiprocessing"))
        out: dict[str, Any] = {"kind": "PyDataset", "class": type(x).__name__,
                               "workers": int(workers), "multiprocessing": bool(mp)}
        augments = _augments(x)
        if augments is not None:
            out["kind"] = "ImageDataGenerator"
            out["augments"] = augments
        return out
    if hasattr(x, "__next__") and hasattr(x, "__iter__"):
        return {"kind": "generator", "workers": 1}
    if hasattr(x, "shape") or isinstance(x, (dict, list, tuple)):
        return {"kind": "arrays", "workers": None}
    return {"kind": type(x).__name__, "workers": None}


def input_files(x: Any) -> list[str]:
    """Absolute paths of the files a Keras input reads, where it names them: a legacy
    ImageDataGenerator iterator's ``filepaths`` (``flow_from_dataframe``/``_directory``), file
    paths sliced into a tf.data pipeline (``image_dataset_from_directory``, ``list_files``) or a
    ``TFRecordDataset``'s files. Empty when unknown (arrays, a PyDataset's own reads)."""
    paths = getattr(x, "filepaths", None)
    if not isinstance(paths, (list, tuple)):
        paths = _tf_data_files(x) if _is_tf_data(x) else []
    files = [os.path.abspath(p) for p in paths if isinstance(p, str)]
    return files if files and os.path.isfile(files[0]) else []


def _tf_data_files(ds: Any) -> list[str]:
    """String tensors of file paths at a pipeline's sources: a ``from_tensor_slices`` of paths
    (reached through maps, ``zip`` and ``concatenate``) or a ``TFRecordDataset``'s filenames."""
    out: list[str] = []
    todo, seen = [ds], 0
    while todo and seen < 64:
        d = todo.pop()
        seen += 1
        sources = [getattr(d, "_filenames", None), *(getattr(d, "_tensors", None) or ())]
        for t in sources:
            if getattr(t, "dtype", None) is not None and t.dtype.name == "string" \
                    and t.shape.rank == 1:
                out += [b.decode(errors="replace") for b in t.numpy()]
        todo += [n for n in (getattr(d, "_input_dataset", None),
                             getattr(d, "_dataset_to_concatenate", None)) if n is not None]
        todo += list(getattr(d, "_datasets", None) or [])
    return out


def describe_input(x: Any, call: dict[str, Any], rec: Recorder, framework: str,
                   phase: str, how: str | None = None) -> dict[str, Any]:
    """``classify`` plus ``loader.*`` facts, sent once per phase kind; the files the input
    reads, where it names them (the parent samples their page-cache residency)."""
    if x is not None:
        try:
            rec.dataset_files(x, input_files)
        except Exception as exc:  # a nicety: never break the fit
            rec.note("watch", f"Keras input files not read: {type(exc).__name__}: {exc}")
    out = classify(x, call)
    if out and rec.once(f"loader-{phase}"):
        # random maps are augmentation; none found is not "no augmentation" (a py function's
        # body): read here, once a phase kind, as the hand-written loop classifies every iterator
        if out.get("kind") == "tf.data":
            ops = _map_ops(x)
            if _draws_random(ops):
                out = {**out, "augments": True}
            elif ops and not ops & OPAQUE_OPS:
                out = {**out, "augments": False}  # every map read, none draws a random number
            if ops & DECODE_OPS:
                out = {**out, "decodes": True, "image_bytes": _image_bytes(x)}
            if out.get("cache") and (frozen := _augments_cached(x)) is not None:
                out = {**out, "augments_cached": frozen}
        how = how or f"watch: the {phase} input of {framework} Model.fit/evaluate"
        how += f" ({type(x).__name__})"
        prefix = "loader." if phase == "train" else "loader.val_"
        for key, value in out.items():
            rec.fact(prefix + key, value, how)
    return out


def _num_samples(x: Any) -> int | None:
    if isinstance(x, dict) and x:
        x = next(iter(x.values()))
    if isinstance(x, (list, tuple)) and x and hasattr(x[0], "shape"):
        x = x[0]
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    return None


def batch_images(n: int | None, batch_size: int | None) -> ImagesFn:
    """``images(first, last)``: samples in batches ``first..last`` of an epoch over ``n``."""

    def images(first: int, last: int) -> int:
        if batch_size is None:
            return 0
        total = 0
        for i in range(first, last + 1):
            left = batch_size if n is None else n - i * batch_size
            total += max(0, min(batch_size, left))
        return total

    return images


def loop_sizes(name: str, a: dict[str, Any], rec: Recorder) -> tuple[ImagesFn, ImagesFn]:
    """Images-per-batch functions for the train and val phases of this call, used where the
    batches themselves were not counted (tf.data under a distribution strategy)."""
    x = a.get("x")
    n = _num_samples(x)
    bs = a.get("batch_size") or (32 if n is not None else getattr(x, "batch_size", None))
    if name != "fit":
        return batch_images(n, bs), batch_images(n, bs)
    val_bs = a.get("validation_batch_size") or bs
    split = a.get("validation_split") or 0.0
    val = a.get("validation_data")
    if split and n is not None:
        n_train = int(n * (1.0 - split))
        return batch_images(n_train, bs), batch_images(n - n_train, val_bs)
    val_x = val[0] if isinstance(val, (tuple, list)) and val else val
    n_val = _num_samples(val_x)
    if n_val is None and val_x is not None:
        val_bs = a.get("validation_batch_size") or getattr(val_x, "batch_size", None)
    return batch_images(n, bs), batch_images(n_val, val_bs)
