"""The training loop: the seed's job (frozen backbone, new head, validation every epoch,
checkpoint on the best validation metric), timed by :class:`stepscope.Monitor`."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from stepscope.atomic import atomic_open
from stepscope.errors import StepscopeError, disk_error
from stepscope.observe.monitor import LiveStats, Monitor
from stepscope.reports import EpochMetrics, epoch_metric
from stepscope.store.rundir import RunDir
from stepscope.train import checkpoint, data, featcache, gpuaug, memory, precision, setup
from stepscope.train.config import TrainConfig, default_run_dir, save_config
from stepscope.train.distributed import Dist

METRICS_FIELDS = ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "seconds"]


class Progress(Protocol):
    """What the loop tells whoever shows progress (the CLI renders it with rich)."""

    def phase_start(self, epoch: int, epochs: int, phase: str, steps: int) -> None: ...
    def step(self, done: int, loss: float | None, accuracy: float | None, live: LiveStats) -> None: ...
    def phase_end(self) -> None: ...
    def epoch_end(self, row: EpochMetrics) -> None: ...
    def message(self, text: str) -> None: ...


class _Quiet:
    def phase_start(self, epoch: int, epochs: int, phase: str, steps: int) -> None: ...
    def step(self, done: int, loss: float | None, accuracy: float | None, live: LiveStats) -> None: ...
    def phase_end(self) -> None: ...
    def epoch_end(self, row: EpochMetrics) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class PhaseResult:
    loss: float
    accuracy: float
    images: int
    seconds: float
    bad_files: list[str] = field(default_factory=list)


@dataclass
class TrainResult:
    run_dir: Path
    rows: list[EpochMetrics]
    best_metric: float | None
    status: str
    bad_files: list[str]
    rank: int = 0  # under torchrun: only rank 0 analyses the run and prints


# Reading a GPU tensor into Python waits for the GPU: the loop keeps loss and accuracy sums on
# the device and reads them only this often, never every step.
PROGRESS_EVERY_S = 0.5


def _step_stats(logits: torch.Tensor, y: torch.Tensor, binary: bool) -> torch.Tensor:
    # Two classes: one logit per image (N,), positive means class 1.
    pred = (logits > 0).long() if binary else logits.argmax(1)
    return (pred == y).sum()


def run_phase(
    mon: Monitor, s: setup.Setup, loader: Any, *, phase: str, epoch: int, epochs: int,
    optimizer: torch.optim.Optimizer | None, progress: Progress, probe: memory.MemoryProbe,
    max_steps: int | None = None, cache: featcache.FeatureCache | None = None,
) -> PhaseResult:
    """One pass over ``loader``: training when ``optimizer`` is given, else validation.

    With ``cache``, a phase whose frozen-trunk features are cached iterates those features and
    runs the head alone (see train/featcache.py).
    """
    model, device = s.model, s.device
    training = optimizer is not None
    # Under torchrun the train phase runs through DDP (gradients all-reduced in backward);
    # validation calls the plain model: no collective per step, so shards may differ in length.
    net = s.ddp if training and s.ddp is not None else model
    model.train(training)
    loss_fn = model.loss_fn()
    binary = model.num_classes == 2
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    images, bad, last_report, t0 = 0, [], 0.0, time.perf_counter()
    batches: Any = gpuaug.DevicePrefetcher(loader, device) if s.device_prefetch else loader
    forward: featcache.Forward = net
    if cache is not None:
        batches, forward = cache.source(phase, batches, net, epoch=epoch + 1)
    progress.phase_start(epoch, epochs, phase, len(batches))
    grad = contextlib.nullcontext() if training else torch.no_grad()
    shape_hint: torch.Tensor | None = None
    with grad:
        for i, (x, y, bad_files) in enumerate(mon.loader(batches, phase=phase, epoch=epoch + 1)):
            bad.extend(bad_files)
            if len(y) == 0:  # every image of this batch was unreadable
                if training and s.ddp is not None:
                    _null_step(net, optimizer, _null_input(shape_hint, s), device)
                continue
            if shape_hint is None:
                shape_hint = x[:1]
            with mon.copy():
                # non_blocking only overlaps with compute when the batch sits in pinned memory.
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                if s.channels_last and x.dim() == 4:  # cached features are (N, features)
                    x = x.contiguous(memory_format=torch.channels_last)
            with mon.compute():
                if training and s.gpu_aug is not None:
                    x = s.gpu_aug(x)  # --aug-backend gpu: the batch's augmentation, on the device
                with probe.first_step(x, training):
                    with precision.autocast_context(device, s.bf16):
                        logits = forward(x)
                    loss = loss_fn(logits.float(), y)
                if training:
                    assert optimizer is not None
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    probe.after_first_step(optimizer)
                loss_sum += loss.detach() * len(y)
                correct += _step_stats(logits.detach(), y, binary)
            images += len(y)
            now = time.perf_counter()
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                progress.step(i + 1, float(loss_sum) / images, float(correct) / images, mon.live())
            if max_steps is not None and i + 1 >= max_steps:
                break
    progress.step(len(batches), float(loss_sum) / max(images, 1), float(correct) / max(images, 1),
                  mon.live())
    progress.phase_end()
    return PhaseResult(
        loss=float(loss_sum) / max(images, 1), accuracy=float(correct) / max(images, 1),
        images=images, seconds=time.perf_counter() - t0, bad_files=bad,
    )


def _apply_memory_controls(cfg: TrainConfig, device: torch.device, progress: Progress) -> None:
    if cfg.gpu_memory_fraction is None and cfg.alloc_conf is None:
        return
    if device.type != "cuda":
        progress.message(
            "note: --gpu-memory-fraction and --alloc-conf apply to CUDA only; ignored on the CPU"
        )
        return
    if cfg.gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_fraction, device)


def _write_metrics(path: Path, rows: list[EpochMetrics]) -> None:
    with atomic_open(path, "w", newline="") as fh:
        # An epoch without validation leaves its val_ cells empty.
        w = csv.DictWriter(fh, fieldnames=METRICS_FIELDS, restval="", extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow(row)


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler stopping the job, `kill`) ends the run as Ctrl-C does.

    By default SIGTERM kills the process where it stands: mid checkpoint write that leaves the
    temporary file behind and the run marked running. As KeyboardInterrupt it unwinds: the
    atomic write removes its temporary (the previous checkpoint stays), the run is marked
    interrupted. Only the main thread may set a handler; elsewhere this does nothing.
    """
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _null_input(shape_hint: torch.Tensor | None, s: setup.Setup) -> torch.Tensor:
    """A one-image input for :func:`_null_step`: the last good batch's shape, or before any
    (the rank's first batch was all unreadable) the shape the loader's transform yields.

    Without either the rank cannot join the all-reduce, and the other ranks would wait in it
    until the collective timeout (600 s): it stops instead, and the launcher stops them all.
    """
    if shape_hint is not None:
        return shape_hint
    if s.image_shape is None:
        raise StepscopeError(
            "every image of this rank's first batch was unreadable and the input shape is "
            "unknown, so it cannot join the other ranks' step; stopping the job (see the "
            "bad-items list; remove or fix those files)")
    return torch.zeros((1, *s.image_shape), dtype=torch.uint8)


def _null_step(net: Any, optimizer: torch.optim.Optimizer | None,
               shape_hint: torch.Tensor | None, device: torch.device) -> None:
    """A rank whose batch was all unreadable still joins the step's all-reduce.

    Under DDP every rank's backward all-reduces the gradients; a rank that skipped the step
    would leave the others waiting in that collective until its timeout (600 s). So it runs a
    zero-weighted forward and backward (gradients 0: the step averages the other ranks'
    batches) and steps its optimizer with the averaged gradients, so its weights stay equal to
    theirs.
    """
    if optimizer is None or shape_hint is None:
        return
    optimizer.zero_grad(set_to_none=True)
    out = net(torch.zeros_like(shape_hint, device=device).float())
    (out.float().sum() * 0.0).backward()
    optimizer.step()


@contextlib.contextmanager
def _disk_errors(run_dir: Path, what: str) -> Iterator[None]:
    """The rule when the run's disk fails (full, read-only, quota): training stops at once with
    one line naming the disk; every file written before is whole (writes are atomic, so the
    previous checkpoint survives) and run.db keeps everything committed."""
    try:
        yield
    except OSError as exc:
        err = disk_error(exc, f"{what} in {run_dir}",
                         f"training stopped; the previous checkpoint is intact. Free space, then "
                         f"continue with --resume {run_dir}")
        if err is None:
            raise
        raise err from exc


def _check_writable(run_dir: Path) -> None:
    """Before any training: the run directory must take files (not read-only, not full)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".stepscope-probe-"):
            pass
    except OSError as exc:
        raise StepscopeError(
            f"cannot write to the run directory {run_dir} ({exc.strerror or exc}); choose a "
            "writable --out, or fix the directory's permissions") from exc


def _is_better(metric: str, value: float, best: float | None) -> bool:
    if best is None:
        return True
    return value > best if metric == "val_accuracy" else value < best


def train(cfg: TrainConfig, progress: Progress | None = None) -> TrainResult:
    """Run ``cfg`` end to end and record it; returns where the run directory is.

    Examples:
        >>> cfg = resolve_config({"csv": "d/train.csv", "val_csv": "d/valid.csv", "images": "d/images"})
        >>> train(cfg).run_dir
    """
    progress = progress or _Quiet()
    stop_on_sigterm()
    if cfg.alloc_conf:
        # The CUDA caching allocator reads this once, when CUDA is first used: set it first.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = cfg.alloc_conf
    dist = Dist.from_env()  # under torchrun: this rank's share of the node, then the group
    cfg = dist.resolve_config(cfg)
    dist.init(cfg)
    if not dist.is_primary:
        progress = _Quiet()
    run_dir = dist.agree_path(Path(cfg.resume) if cfg.resume else default_run_dir(cfg))
    if not cfg.resume and RunDir(run_dir).has_training_state():
        raise StepscopeError(
            f"{run_dir} already holds a run: use --resume {run_dir} to continue it, "
            "or another --out to start a new one"
        )
    _check_writable(run_dir)
    dist.barrier()  # every rank has checked before any rank creates run files
    resume_state = checkpoint.load_checkpoint(RunDir(run_dir).last_checkpoint) if cfg.resume else None
    baseline_bytes = memory.process_rss_bytes()
    # Before the model touches the device: the context is measured as it is created.
    context_bytes = memory.cuda_context_bytes(setup.resolve_device(cfg.device))
    s = setup.build(cfg)
    _apply_memory_controls(cfg, s.device, progress)
    run_dir.mkdir(parents=True, exist_ok=True)
    if dist.is_primary:
        save_config(cfg, RunDir(run_dir).config)
    trainable = [p for p in s.model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=cfg.lr)
    rows: list[EpochMetrics] = []
    best: float | None = None
    start_epoch = 0
    if resume_state is not None:
        s.model.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        rows, best = list(resume_state.get("rows", [])), resume_state.get("best")
        start_epoch = int(resume_state["epoch"]) + 1
        if start_epoch >= cfg.epochs:
            raise StepscopeError(
                f"{run_dir} already finished {start_epoch} of {cfg.epochs} epochs: nothing to resume "
                "(give a larger --epochs to train further)"
            )
        progress.message(f"resuming {run_dir} at epoch {start_epoch + 1} of {cfg.epochs}")
    files = data.dataset_files(s.split)
    mon = Monitor(
        run_dir, kind="train", name=cfg.name or run_dir.name, dataset_files=files,
        interval_s=cfg.interval_s, device=s.device, sample=cfg.monitor, config=cfg.to_dict(),
        rank=dist.rank, world_size=dist.world_size, db_name=dist.db_name,
        host_samplers=dist.local_rank == 0,
    )
    status = "failed"
    store_told = False
    all_bad: list[str] = []
    if cfg.monitor:  # without it the Monitor still frames steps for the progress line, stores nothing
        mon.start()
    dist.prepare(s, mon, unfrozen=cfg.unfreeze > 0)
    try:
        probe = memory.MemoryProbe(mon, s.model, s.device, name=cfg.model)
        probe.record_static(files, baseline_bytes, workers=s.workers)
        probe.record_cuda_context(context_bytes)
        probe.record_precision(bf16=s.bf16, bf16_supported=precision.bf16_pays(s.device),
                               channels_last=s.channels_last)
        cache = featcache.create_feature_cache(cfg, bf16=s.bf16, device=s.device, files=files,
                                               mon=mon)
        dist.limit_cache(cache)
        for epoch in range(start_epoch, cfg.epochs):
            t_epoch = time.perf_counter()
            dist.set_epoch(epoch)
            tr = run_phase(mon, s, s.train_loader, phase="train", epoch=epoch, epochs=cfg.epochs,
                           optimizer=optimizer, progress=progress, probe=probe,
                           max_steps=cfg.max_steps, cache=cache)
            tr.loss, tr.accuracy, tr.images = dist.reduce_means(tr.loss, tr.accuracy, tr.images)
            all_bad.extend(tr.bad_files)
            val: tuple[float, float] | None = None
            if s.val_loader is not None and (epoch + 1) % cfg.val_every == 0:
                va = run_phase(mon, s, s.val_loader, phase="val", epoch=epoch, epochs=cfg.epochs,
                               optimizer=None, progress=progress, probe=probe,
                               max_steps=cfg.max_steps, cache=cache)
                va.loss, va.accuracy, va.images = dist.reduce_means(va.loss, va.accuracy, va.images)
                val = (va.loss, va.accuracy)
                all_bad.extend(va.bad_files)
            row: EpochMetrics = {"epoch": epoch + 1, "train_loss": tr.loss,
                                 "train_accuracy": tr.accuracy,
                                 "seconds": time.perf_counter() - t_epoch}
            if val is not None:
                row["val_loss"], row["val_accuracy"] = val
            rows.append(row)
            if dist.is_primary:
                with _disk_errors(run_dir, "checkpoints and metrics.csv"):
                    best = _save_checkpoints(mon, s, optimizer, cfg, run_dir, epoch, rows, best)
                    _write_metrics(RunDir(run_dir).metrics_csv, rows)
            if mon.store_error and not store_told:
                store_told = True
                progress.message(f"recording stopped, training goes on: {mon.store_error}")
            if all_bad:
                progress.message(_bad_files_message(all_bad))
            progress.epoch_end(row)
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        mon.close(status)
        if status != "completed":
            dist.abort()
    dist.finish(run_dir)
    return TrainResult(run_dir, rows, best, status, all_bad, rank=dist.rank)


def _bad_files_message(bad: list[str]) -> str:
    skipped = [b for b in bad if not isinstance(b, data.WarnedFile)]
    warned = [b for b in bad if isinstance(b, data.WarnedFile)]
    lines = []
    if skipped:
        names = ", ".join(sorted(set(skipped))[:5])
        lines.append(f"skipped {len(skipped)} unreadable image(s) so far (corrupt or truncated): "
                     f"{names}")
    if warned:
        # libjpeg's own line, printed raw it named no file; the image decoded and is trained on.
        first = {str(w): w.warning for w in warned}
        names = ", ".join(f"{n} ({first[n]})" for n in sorted(first)[:5])
        lines.append(f"kept {len(first)} image(s) the JPEG decoder warned about (damaged but "
                     f"decodable): {names}")
    return "\n".join(lines)


def _save_checkpoints(
    mon: Monitor, s: setup.Setup, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
    run_dir: Path, epoch: int, rows: list[EpochMetrics], best: float | None,
) -> float | None:
    state = {
        "model": s.model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
        "rows": rows, "best": best, "classes": list(s.split.classes),
        "config": cfg.to_dict(),
    }
    value = epoch_metric(rows[-1], cfg.monitor_metric)
    rd = RunDir(run_dir)
    if value is not None and _is_better(cfg.monitor_metric, value, best):
        best = value
        state["best"] = best
        w = checkpoint.save_checkpoint(state, rd.best_checkpoint)
        mon.record("trainer", "checkpoint_write_s", w.seconds)
        mon.fact("model.file_bytes", w.bytes, "size of checkpoints/best.pt on disk")
    w = checkpoint.save_checkpoint(state, rd.last_checkpoint)
    mon.record("trainer", "checkpoint_write_s", w.seconds)
    return best
