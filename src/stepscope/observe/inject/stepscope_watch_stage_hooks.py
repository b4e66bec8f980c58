"""The library hooks that feed the loader's stage counters (``stepscope_watch_stages``).

Installed by the Monitor (for what is imported when it starts) and by ``watch`` (as each
library is imported). Forked workers inherit the patched functions; a worker started with
``spawn``/``forkserver`` is a fresh interpreter, so the hooked DataLoader iterator wraps its
``worker_init_fn`` (:class:`WorkerHooks`), which installs them there first. Each hook costs one ``Stage`` enter/exit (~1 µs, ``bench/stage_hooks.py``)
when ``STEPSCOPE_STAGES_DIR`` is set and a dictionary lookup when it is not.

- torch: ``_MapDatasetFetcher.fetch`` / ``_IterableDatasetFetcher.fetch`` (one batch: every
  ``dataset[i]`` plus ``collate_fn``), the fetcher's ``collate_fn`` and ``pin_memory``.
- PIL: ``Image.open`` (read, with the file's size when given a path),
  ``ImageFile.ImageFile.load`` (decode) and ``Image.resize``/``rotate``/``transpose``/``filter``
  (transform).
- OpenCV: ``cv2.imread`` (read + decode, counted as decode, with the file's size),
  ``cv2.imdecode`` (decode) and ``resize``/``warpAffine``/``warpPerspective``/``flip``/``rotate``/
  ``cvtColor`` (transform).
- torchvision: ``io.read_file`` (read), ``io.decode_*`` (decode), ``transforms.Compose.__call__``
  and ``transforms.v2.Compose.__call__`` (transform).

Like the counters, this module imports only the standard library, and is loaded under two
names: as the top-level ``stepscope_watch_stage_hooks`` inside a watched interpreter (see
``sitecustomize``) and as ``stepscope.observe.inject.stepscope_watch_stage_hooks`` by the
Monitor. It must reach the counters module under the same kind of name, or it would count into
a second copy of their state.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from stepscope.observe.inject import stepscope_watch_stages as counters
else:
    import stepscope_watch_stages as counters

BatchTimer = counters.BatchTimer
Stage = counters.Stage
timed = counters.timed

def _path_size(fp: Any, *_: Any, **__: Any) -> int:
    if isinstance(fp, (str, bytes, os.PathLike)):
        return os.stat(fp).st_size
    return 0


def install_torch(torch: ModuleType) -> None:
    """Time every fetch, collate and pin of torch's DataLoader."""
    fetch_mod = torch.utils.data._utils.fetch
    for cls in (fetch_mod._MapDatasetFetcher, fetch_mod._IterableDatasetFetcher):
        if getattr(cls.fetch, "_stepscope_stage", None):
            continue
        cls.fetch = _timed_fetch(cls.fetch)
    pin_mod = torch.utils.data._utils.pin_memory
    pin_mod.pin_memory = timed("pin", pin_mod.pin_memory)
    it = torch.utils.data.dataloader._MultiProcessingDataLoaderIter
    if not getattr(it.__init__, "_stepscope_stage", None):
        it.__init__ = _hooking_spawned_workers(it.__init__)


class WorkerHooks:
    """A DataLoader's ``worker_init_fn`` that first installs the stage hooks in the worker.

    A worker started with ``spawn`` or ``forkserver`` is a fresh interpreter: it imports torch
    (and the dataset's modules) unpatched, so without this it times nothing. The worker calls
    its ``worker_init_fn`` after unpickling the dataset (whose imports — PIL, cv2,
    torchvision — are loaded by then) and before it builds its fetcher, so the hooks are in
    place for every batch. The counters' folder comes with the environment it inherits.
    """

    def __init__(self, init_fn: Callable[[int], Any] | None) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        import importlib

        # The libraries imported so far are hooked at once, those the dataset imports later
        # (inside __getitem__) as they are imported. A hook that fails leaves that library
        # untimed: a worker has no run to write a note into, and must never fail for us.
        package = __name__.rpartition(".")[0]
        try:
            imports = importlib.import_module(
                f"{package}.stepscope_watch_imports" if package else "stepscope_watch_imports")
            imports.PostImportFinder(library_hooks(), lambda name, exc: None).install()
        except Exception:
            pass
        if self.init_fn is not None:
            self.init_fn(worker_id)


def _start_method(loader: Any) -> str | None:
    ctx = loader.multiprocessing_context
    if ctx is None:
        import multiprocessing

        # What the iterator's queues are about to fix anyway (torch.multiprocessing's default).
        ctx = multiprocessing.get_context()
    try:
        return str(ctx.get_start_method())
    except Exception:  # an odd context object: leave its workers alone
        return None


def _hooking_spawned_workers(orig: Any) -> Any:
    def __init__(self: Any, loader: Any) -> None:
        method = _start_method(loader)
        if counters._folder is None or method not in ("spawn", "forkserver"):
            # Forked workers inherit the patched functions and the folder.
            return orig(self, loader)
        import sys

        # The worker unpickles WorkerHooks by its module's name. Under ``watch`` that is the
        # top-level ``stepscope_watch_stage_hooks``, whose folder ``sitecustomize`` took off
        # sys.path again; a spawned process starts with its parent's sys.path, so it is put
        # back (last, shadowing nothing) only while the workers start.
        here = os.path.dirname(os.path.abspath(__file__))
        added = "." not in __name__ and here not in sys.path
        user_fn = loader.worker_init_fn
        try:
            if added:
                sys.path.append(here)
            loader.worker_init_fn = WorkerHooks(user_fn)
            orig(self, loader)
        finally:
            loader.worker_init_fn = user_fn
            if added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(here)

    __init__._stepscope_stage = "workers"  # type: ignore[attr-defined]
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    return __init__


def _timed_fetch(orig: Any) -> Any:
    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        cf = self.collate_fn
        if not getattr(cf, "_stepscope_stage", None):
            self.collate_fn = timed("collate", cf)
        items = len(possibly_batched_index) if self.auto_collation else 1
        with BatchTimer(items):
            return orig(self, possibly_batched_index)

    fetch._stepscope_stage = "fetch"  # type: ignore[attr-defined]
    return fetch


def install_pil(pil_image: Any) -> None:
    """``PIL.Image``: open reads (a path) or parses (a buffer); the decode is ``ImageFile``'s
    (``install_pil_file``)."""
    orig_open = pil_image.open
    if getattr(orig_open, "_stepscope_stage", None):
        return

    def open_(fp: Any, *args: Any, **kwargs: Any) -> Any:
        is_path = isinstance(fp, (str, bytes, os.PathLike))
        with Stage("read" if is_path else "decode", _path_size(fp) if is_path else 0):
            return orig_open(fp, *args, **kwargs)

    open_._stepscope_stage = "read"  # type: ignore[attr-defined]
    pil_image.open = open_
    # a dataset's own geometry and filters, outside torchvision's Compose (nested inside it,
    # each stage keeps its own time)
    for name in PIL_TRANSFORMS:
        setattr(pil_image.Image, name, timed("transform", getattr(pil_image.Image, name)))


PIL_TRANSFORMS = ("resize", "rotate", "transpose", "filter")


def install_pil_file(pil_image_file: Any) -> None:
    """``PIL.ImageFile``: an opened file's pixels are decoded in ``ImageFile.load`` (which
    ``convert``, ``resize`` and ``numpy.asarray`` call), an override of ``Image.load``, which
    decodes nothing: timing that one left every JPEG's decode in the item's own time."""
    cls = pil_image_file.ImageFile
    cls.load = timed("decode", cls.load)


# OpenCV's geometry and colour functions: a dataset's own transforms, and what Albumentations
# runs inside its transforms
CV2_TRANSFORMS = ("resize", "warpAffine", "warpPerspective", "flip", "rotate", "cvtColor")


def install_cv2(cv2: Any) -> None:
    """OpenCV's file and buffer decoders, and its transforms."""
    if hasattr(cv2, "imread"):
        cv2.imread = timed("decode", cv2.imread, _path_size)
    if hasattr(cv2, "imdecode"):
        cv2.imdecode = timed("decode", cv2.imdecode)
    for name in CV2_TRANSFORMS:
        if hasattr(cv2, name):
            setattr(cv2, name, timed("transform", getattr(cv2, name)))


def install_torchvision(tv: ModuleType) -> None:
    """torchvision's file reader, decoders and Compose."""
    io = getattr(tv, "io", None)
    if io is not None:
        if hasattr(io, "read_file"):
            io.read_file = timed("read", io.read_file, _path_size)
        for name in ("decode_jpeg", "decode_png", "decode_image", "decode_webp", "read_image"):
            if hasattr(io, name):
                setattr(io, name, timed("decode", getattr(io, name)))
    for mod_name in ("transforms", "transforms.v2"):
        mod: Any = tv
        for part in mod_name.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                break
        compose = getattr(mod, "Compose", None) if mod is not None else None
        if compose is not None and "__call__" in vars(compose):
            compose.__call__ = timed("transform", compose.__call__)
        elif compose is not None and "forward" in vars(compose):
            compose.forward = timed("transform", compose.forward)


def library_hooks() -> dict[str, Callable[[Any], None]]:
    """Each hooked library's module name, with what installs its hooks."""
    return {"torch": install_torch, "PIL.Image": install_pil,
            "PIL.ImageFile": install_pil_file, "cv2": install_cv2,
            "torchvision": install_torchvision}


def install_loaded(modules: dict[str, ModuleType]) -> list[str]:
    """Install every hook whose library is already imported; the names of those installed."""
    done: list[str] = []
    for name, install in library_hooks().items():
        mod = modules.get(name)
        if mod is None:
            continue
        try:
            install(mod)
            done.append(name)
        except (AttributeError, TypeError):  # an unexpected library version: no stage timing
            continue
    return done
