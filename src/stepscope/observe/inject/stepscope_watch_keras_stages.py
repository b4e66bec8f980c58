"""Stages inside Keras's ImageDataGenerator: where one image's loading time goes.

The legacy ``ImageDataGenerator`` iterators (``flow``, ``flow_from_directory``,
``flow_from_dataframe``; Keras 3's ``keras.src.legacy.preprocessing.image`` and tf-keras's
``tf_keras.src.preprocessing.image``) build a batch image by image in
``_get_batches_of_transformed_samples``:

- ``load``        ``image_utils.load_img``: read the file, decode it, resize to ``target_size``
- ``transform``   ``get_random_transform`` + ``apply_transform``: the random augmentation (an
  affine warp with SciPy per channel, flips, brightness)
- ``preprocess``  ``standardize``: ``preprocessing_function`` (e.g. ``preprocess_input``) and
  the rescale/centring options

and ``__getitem__`` as a whole is the batch, timed per loading thread (``busy_s`` by thread:
how busy each PyDataset worker thread was).

``PyDataset(workers=N, use_multiprocessing=True)`` (and tf-keras's ``fit(workers=N,
use_multiprocessing=True)``) builds batches in a ``multiprocessing.Pool``: the enqueuer sends
each index to the pool as ``apply_async(get_index, (uid, i))``, and ``get_index`` is pickled by
name, so the worker runs whatever the module's ``get_index`` is. ``install_pool_workers``
replaces it with one that times the call in a pool worker on that process's own stage board
(``stepscope_watch_stages``: a memory-mapped page per process, read by the training process at
phase boundaries), so each worker's busy time comes back as the phase's ``workers`` rows, as a
DataLoader worker's does. Forked workers inherit the replacement. With ``use_multiprocessing=False``
(``workers>1``) the same ``get_index`` runs on a thread pool of the training process: each thread
times its calls in a row of its own (``ThreadTimer``: wall, on-CPU and run-queue seconds), which
come back as the phase's ``workers`` rows marked as threads, so Python code that holds the GIL
shows as threads busy far longer than they ran. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject import stepscope_watch_stages as board_stages
else:
    try:  # in the watched interpreter a top-level module (see sitecustomize)
        import stepscope_watch_stages as board_stages
    except ImportError:
        from stepscope.observe.inject import stepscope_watch_stages as board_stages

STAGES = ("load", "transform", "preprocess")


class LoaderStages:
    """Seconds per stage, images, batches and per-thread busy time, since the process began."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        board_stages.renew_lock_after_fork(self, "lock")  # a forked pool worker takes it
        self.stage_s = dict.fromkeys(STAGES, 0.0)
        self.images = 0
        self.batches = 0
        self.busy_s: dict[int, float] = {}

    def add(self, stage: str, dt: float, images: int = 0) -> None:
        with self.lock:
            self.stage_s[stage] += dt
            self.images += images

    def batch(self, dt: float) -> None:
        tid = threading.get_ident()
        with self.lock:
            self.batches += 1
            self.busy_s[tid] = self.busy_s.get(tid, 0.0) + dt

    # free-form: a JSON record written as a fact (keras_stages.phase.<id>), read by key
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"stage_s": dict(self.stage_s), "images": self.images,
                    "batches": self.batches, "busy_s": dict(self.busy_s)}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """What the loader did between two snapshots; None when it built no batch."""
    batches = after["batches"] - before["batches"]
    if batches <= 0:
        return None
    busy = [round(s - before["busy_s"].get(tid, 0.0), 6) for tid, s in after["busy_s"].items()
            if s - before["busy_s"].get(tid, 0.0) > 0]
    return {"stage_s": {k: round(after["stage_s"][k] - before["stage_s"][k], 6) for k in STAGES},
            "images": after["images"] - before["images"], "batches": batches,
            "thread_busy_s": sorted(busy, reverse=True)}


def _timed(fn: Callable[..., Any], stages: LoaderStages, stage: str,
           count: bool = False) -> Callable[..., Any]:
    clock = stages.clock

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            stages.add(stage, clock() - t0, 1 if count else 0)

    wrapper._stepscope_stage = stage  # type: ignore[attr-defined]
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def install(module: Any, stages: LoaderStages) -> None:
    """Patch one ImageDataGenerator module (Keras 3 legacy or tf-keras) to time its stages."""
    utils = module.image_utils
    if getattr(utils.load_img, "_stepscope_stage", None):
        return
    # The iterators look load_img up on the image_utils module at every call.
    utils.load_img = _timed(utils.load_img, stages, "load", count=True)
    gen = module.ImageDataGenerator
    for name, stage in (("get_random_transform", "transform"), ("apply_transform", "transform"),
                        ("standardize", "preprocess")):
        setattr(gen, name, _timed(getattr(gen, name), stages, stage))
    it = module.Iterator
    getitem = it.__getitem__
    clock = stages.clock

    def __getitem__(self: Any, idx: Any) -> Any:
        t0 = clock()
        try:
            return getitem(self, idx)
        finally:
            stages.batch(clock() - t0)

    it.__getitem__ = __getitem__


def install_pool_workers(module: Any, count_images: Callable[[Any], int]) -> bool:
    """Time ``module.get_index`` (Keras 3's ``py_dataset_adapter`` or tf-keras's
    ``data_utils``) in pool worker processes; False when this Keras has no such function."""
    orig = getattr(module, "get_index", None)
    if orig is None or getattr(orig, "_stepscope_stage", None):
        return orig is not None
    parent = os.getpid()

    def get_index(uid: Any, i: Any) -> Any:
        # A thread pool in the loop's own process (``use_multiprocessing=False``) shares one
        # board: each thread keeps its own row instead.
        timer: Any = board_stages.ThreadTimer(0) if os.getpid() == parent \
            else board_stages.BatchTimer(0)
        with timer:
            out = orig(uid, i)
            timer.items = count_images(out)
        return out

    # pickle sends the function by module and name: the worker finds this one there.
    get_index.__module__ = orig.__module__
    get_index.__qualname__ = orig.__qualname__
    get_index._stepscope_stage = "fetch"  # type: ignore[attr-defined]
    get_index.__wrapped__ = orig  # type: ignore[attr-defined]
    module.get_index = get_index
    return True
