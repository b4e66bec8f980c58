"""Feature cache for a frozen trunk: compute deterministic features once, reuse them every epoch.

With a frozen trunk, a validation image goes through the same deterministic pipeline every
epoch (decode, resize, no augmentation) into the same fixed weights, so the trunk returns the
same features each time, and the trunk is nearly all of the phase's cost. The first pass keeps
the head's inputs; every later pass runs only the head on them (a few thousand multiply-adds
per image instead of billions). Without augmentation (``--augment none``) the training
features are just as fixed, so later epochs train the head alone, still shuffled.

The cache lives in memory only, on the device next to the head (no copy per step), and never
on disk: a disk copy would have to be trusted across processes, where a weights file or a
random initialisation could change without any name changing. Within one run it is keyed by a
hash of everything that changes features (model, weights, img_size, precision, layout, device,
resize method, and every file's size and mtime); a phase whose key no longer matches is
recomputed. ``unfreeze > 0`` disables the cache: the trunk then changes every step.

The loop still runs every cached phase through ``Monitor.loader``, so the phase and its steps
are recorded (data wait ≈ 0, no copy, compute = head only), and the fact ``featcache.used``
says which phases were served from the cache, so the explanation can say why they are cheap.

Examples:
    >>> cache = create_feature_cache(cfg, bf16=True, device=torch.device("cpu"),
    ...                              files=files, mon=mon)                  # doctest: +SKIP
    >>> batches, forward = cache.source("val", val_loader, model, epoch=1)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from stepscope.observe.monitor import Monitor
from stepscope.train.config import TrainConfig
from stepscope.train.data import Batch

# A cache that would not fit comfortably next to the model is not kept: 2 GiB holds the
# InceptionResNetV2 features (1,536 float32) of ~350,000 images.
DEFAULT_MAX_BYTES = 2 * 1024**3

Forward = Callable[[Tensor], Tensor]


def cache_key(cfg: TrainConfig, *, bf16: bool, device: torch.device, files: Sequence[Path]) -> str:
    """SHA-256 over everything that changes the trunk's features for these files.

    Examples:
        >>> cache_key(cfg, bf16=True, device=torch.device("cpu"), files=files)  # doctest: +SKIP
        '3f1c...'
    """
    # free-form: what the cache key hashes (JSON-encoded)
    parts: dict[str, Any] = {
        "model": cfg.model, "weights": cfg.weights, "unfreeze": cfg.unfreeze,
        "img_size": cfg.img_size, "bf16": bf16, "channels_last": cfg.channels_last,
        # CPU and GPU kernels round differently; keras and fused resize differently.
        "device": device.type, "aug_backend": cfg.aug_backend,
    }
    if cfg.weights == "none":
        parts["seed"] = cfg.seed  # random initialisation: the seed decides the weights
    elif cfg.weights != "imagenet":
        parts["weights_file"] = _stat(Path(cfg.weights))
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    for path in files:
        digest.update(f"{path}\0{_stat(path)}\n".encode())
    return digest.hexdigest()


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def cacheable_phases(cfg: TrainConfig) -> frozenset[str]:
    """Phases whose features are fixed: validation always, training without augmentation."""
    if not cfg.feature_cache or cfg.unfreeze > 0:
        return frozenset()
    return frozenset({"val", "train"}) if cfg.augment == "none" else frozenset({"val"})


def disabled_reason(cfg: TrainConfig) -> str:
    """Why the cache is off, in words ("" when it is on)."""
    if not cfg.feature_cache:
        return "switched off (--no-feature-cache)"
    if cfg.unfreeze > 0:
        return f"--unfreeze {cfg.unfreeze} trains the trunk: its features change every step"
    return ""


def head_logits(model: nn.Module, feats: Tensor) -> Tensor:
    """The head alone on pooled features: the tail of ``TransferModel.forward``.

    The head runs in fp32 even inside a bf16 autocast region, as in the full forward, so a
    cached step computes exactly what the uncached step's head computed.
    """
    inner: Any = getattr(model, "module", model)  # a DistributedDataParallel wrapper holds it
    with torch.autocast(device_type=feats.device.type, enabled=False):
        logits: Tensor = inner.head(feats)
    return logits.squeeze(-1) if inner.num_classes == 2 else logits


class FeatureBatches:
    """Cached (features, labels) served like a DataLoader: ``Batch(features, labels, [])``.

    Indexing a tensor already on the device is the whole "loading": the data wait of a step
    is microseconds and there is nothing to copy.
    """

    num_workers = 0

    def __init__(
        self, features: Tensor, labels: Tensor, *, batch_size: int, shuffle: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        self.features, self.labels = features, labels
        self.batch_size, self.shuffle, self.generator = batch_size, shuffle, generator

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        n = len(self.labels)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        order = order.to(self.features.device)
        for start in range(0, n, self.batch_size):
            idx = order[start : start + self.batch_size]
            yield Batch(self.features[idx], self.labels[idx], [])


class _Sized:
    """An iterator that reports the length of the loader it walks (for progress lines)."""

    def __init__(self, it: Iterator[Any], loader: Any) -> None:
        self._it, self._loader = it, loader
        self.num_workers = getattr(loader, "num_workers", None)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        return self._it


@dataclass
class _Entry:
    key: str
    features: Tensor
    labels: Tensor


@dataclass
class _Recording:
    """One pass over images whose head inputs are being kept."""

    phase: str
    key: str
    handle: Any
    features: list[Tensor] = field(default_factory=list)
    labels: list[Tensor] = field(default_factory=list)
    complete: bool = False
    overflow: bool = False
    bytes: int = 0


class FeatureCache:
    """Keeps the frozen trunk's features per phase and serves them instead of images.

    Args:
        phases: phases that may be cached (see :func:`cacheable_phases`).
        key_fn: returns the current cache key (see :func:`cache_key`).
        batch_size: images per cached batch (the run's batch size).
        seed: shuffles the cached training features, per epoch.
        mon: where facts and notes go.
        why_off: recorded when ``phases`` is empty.
        max_bytes: a phase whose features would exceed this is not cached.
    """

    def __init__(
        self, phases: frozenset[str], key_fn: Callable[[], str], *, batch_size: int, seed: int,
        mon: Monitor | None = None, why_off: str = "", max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.phases, self.key_fn = phases, key_fn
        self.batch_size, self.seed, self.mon, self.max_bytes = batch_size, seed, mon, max_bytes
        self._entries: dict[str, _Entry] = {}
        self._recording: _Recording | None = None
        # free-form: the featcache.used fact, a JSON record read by key
        self._used: dict[str, Any] = {"enabled": bool(phases), "why": why_off or "",
                                      "phases": sorted(phases), "uses": [], "bytes": 0}
        self._fact()

    def has(self, phase: str) -> bool:
        return phase in self._entries

    @property
    def bytes(self) -> int:
        return sum(_nbytes(e.features) + _nbytes(e.labels) for e in self._entries.values())

    def source(
        self, phase: str, loader: Any, model: nn.Module, *, epoch: int
    ) -> tuple[Any, Forward]:
        """What the loop iterates for this phase, and the forward to call on each batch.

        ``epoch`` is numbered from 1, as the run database numbers phases. Cached: feature
        batches and the head alone. Cacheable but not cached yet: the image
        loader unchanged, with the head's inputs kept while the loop runs the full model. Else
        the loader and the model.
        """
        self._finish_recording()
        if phase not in self.phases:
            return loader, model
        key = self.key_fn()
        entry = self._entries.get(phase)
        if entry is not None and entry.key != key:
            del self._entries[phase]
            self._say(f"{phase} features recomputed in epoch {epoch}: the dataset files or "
                      "the model changed since they were cached")
            entry = None
        if entry is None:
            self._use(epoch, phase, "recorded")
            return _Sized(self._record(phase, key, loader, model), loader), model
        self._use(epoch, phase, "cached", images=len(entry.labels))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        batches = FeatureBatches(entry.features, entry.labels, batch_size=self.batch_size,
                                 shuffle=phase == "train", generator=gen)
        return batches, lambda feats: head_logits(model, feats)

    def _record(self, phase: str, key: str, loader: Any, model: nn.Module) -> Iterator[Any]:
        inner: Any = getattr(model, "module", model)
        head: nn.Module = inner.head
        rec = _Recording(phase, key, handle=None)
        rec.handle = head.register_forward_hook(
            lambda _m, inputs, _out: self._keep_features(rec, inputs[0])
        )
        self._recording = rec
        for batch in loader:
            labels = batch[1]
            if len(labels) > 0:  # the loop skips a batch whose every image was unreadable
                rec.labels.append(labels)
            yield batch
        rec.complete = True

    def _keep_features(self, rec: _Recording, feats: Tensor) -> None:
        if rec.overflow:
            return
        rec.bytes += _nbytes(feats)
        if rec.bytes > self.max_bytes:
            rec.overflow, rec.features = True, []
            return
        rec.features.append(feats.detach())

    def _finish_recording(self) -> None:
        """Commit the last pass, once its last forward has run (the next phase has begun)."""
        rec, self._recording = self._recording, None
        if rec is None:
            return
        rec.handle.remove()
        sizes = [len(f) for f in rec.features]
        if rec.overflow:
            self._say(f"{rec.phase} features not cached: more than {self.max_bytes} bytes")
        elif rec.complete and sizes == [len(y) for y in rec.labels] and sizes:
            feats = torch.cat(rec.features)
            labels = torch.cat(rec.labels).to(feats.device)
            self._entries[rec.phase] = _Entry(rec.key, feats, labels)
            self._used["bytes"] = self.bytes
            self._fact()

    def _use(self, epoch: int, phase: str, how: str, images: int | None = None) -> None:
        self._used["uses"].append({"epoch": epoch, "phase": phase, "how": how, "images": images})
        self._fact()
        if how == "cached" and not any(
            u["phase"] == phase and u["how"] == "cached" for u in self._used["uses"][:-1]
        ):
            self._say(f"{phase} from epoch {epoch} on: the head runs alone on {images} cached "
                      "trunk features (frozen trunk, deterministic input), the trunk is skipped")

    def _fact(self) -> None:
        self._used["phases"] = sorted(self.phases)  # a caller may narrow them (distributed.py)
        if self.mon is not None:
            # A copy: the writer thread serialises the value later, while this dict keeps growing.
            self.mon.fact("featcache.used", copy.deepcopy(self._used),
                          "phases served from the frozen trunk's cached features (train/featcache)")

    def _say(self, text: str) -> None:
        if self.mon is not None:
            self.mon.note("featcache", text)


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def create_feature_cache(
    cfg: TrainConfig, *, bf16: bool, device: torch.device, files: Sequence[Path],
    mon: Monitor | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
) -> FeatureCache:
    """The run's feature cache (it caches nothing when ``cfg`` rules it out).

    Examples:
        >>> cache = create_feature_cache(cfg, bf16=False, device=torch.device("cpu"),
        ...                              files=[])                          # doctest: +SKIP
        >>> cache.phases
        frozenset({'val'})
    """
    file_list = list(files)
    return FeatureCache(
        cacheable_phases(cfg),
        lambda: cache_key(cfg, bf16=bf16, device=device, files=file_list),
        batch_size=cfg.batch_size, seed=cfg.seed, mon=mon, why_off=disabled_reason(cfg),
        max_bytes=max_bytes,
    )
