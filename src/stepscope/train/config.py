"""The trainer's configuration: defaults < YAML file (``--config``) < command-line flags.

The resolved configuration is saved beside the run as ``config.yaml`` and can be given back to
``stepscope train --config`` to repeat a run (``stepscope tune`` writes one too).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stepscope.atomic import atomic_write_text
from stepscope.errors import StepscopeError


@dataclass
class TrainConfig:
    """Everything ``stepscope train`` needs; field names are the YAML keys and (with dashes)
    the command-line flags."""

    # data
    csv: str | None = None
    val_csv: str | None = None
    images: str | None = None
    folder: str | None = None
    x_col: str = "Photo"
    y_col: str = "Class"
    val_split: float = 0.2
    on_missing: str = "error"
    follow_links: bool = False  # trust image links that lead outside the image folder
    max_image_pixels: int = 89_478_485  # larger images are refused before decoding (0: no limit)
    # input pipeline
    augment: str = "seed"
    aug_backend: str = "fused"
    img_size: int = 299
    batch_size: int = 8
    workers: str = "auto"
    prefetch: int = 2
    # model and optimisation
    model: str = "efficientnet_lite0"
    weights: str = "imagenet"
    unfreeze: int = 0
    lr: float = 1e-4
    epochs: int = 10
    val_every: int = 1
    monitor_metric: str = "val_accuracy"
    precision: str = "auto"
    channels_last: bool = True
    feature_cache: bool = True
    device_prefetch: bool = True  # CUDA: copy the next batch on a side stream during compute
    device: str = "auto"
    seed: int = 0
    threads: int | None = None
    gpu_memory_fraction: float | None = None
    alloc_conf: str | None = None
    # run
    out: str | None = None
    name: str | None = None
    monitor: bool = True
    interval_s: float = 1.0
    resume: str | None = None
    max_steps: int | None = None
    # free-form: an `extra:` mapping a config file may carry, kept as given (nothing reads it)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


# free-form: a YAML mapping as read (its keys checked against TrainConfig, values by validate)
def load_yaml_config(path: Path) -> dict[str, Any]:
    """Read a config YAML (a saved ``config.yaml`` or one ``stepscope tune`` wrote)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError as exc:
        raise StepscopeError(f"config file {path} not found") from exc
    except yaml.YAMLError as exc:
        raise StepscopeError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise StepscopeError(f"config file {path} must hold a mapping of keys, found {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise StepscopeError(
            f"config file {path} has unknown keys {unknown}; valid keys: {sorted(_FIELDS)}"
        )
    return data


def resolve_config(
    flags: dict[str, Any], config_file: Path | None = None, base: dict[str, Any] | None = None
) -> TrainConfig:
    """Merge defaults < ``base`` (e.g. a resumed run's config) < YAML file < explicit flags.

    ``flags`` holds only what the user actually gave (``None`` means "not given").
    """
    merged: dict[str, Any] = {}
    if base:
        merged.update({k: v for k, v in base.items() if k in _FIELDS})
    if config_file is not None:
        merged.update(load_yaml_config(config_file))
    merged.update({k: v for k, v in flags.items() if v is not None and k in _FIELDS})
    cfg = TrainConfig(**merged)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Reject impossible combinations with a message that says what to change."""
    if cfg.folder is None and cfg.csv is None:
        raise StepscopeError("no dataset given: use --csv FILE --images DIR, or --folder DIR")
    if cfg.folder is not None and cfg.csv is not None:
        raise StepscopeError("give either --folder or --csv/--images, not both")
    if cfg.csv is not None and cfg.images is None:
        raise StepscopeError("--csv needs --images DIR (the folder the CSV's file names are in)")
    checks = [
        (cfg.batch_size >= 1, f"--batch-size must be >= 1, got {cfg.batch_size}"),
        (cfg.epochs >= 1, f"--epochs must be >= 1, got {cfg.epochs}"),
        (cfg.img_size >= 32, f"--img-size must be >= 32, got {cfg.img_size}"),
        (0.0 < cfg.val_split < 1.0, f"--val-split must be between 0 and 1, got {cfg.val_split}"),
        (cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}"),
        (cfg.val_every >= 1, f"--val-every must be >= 1, got {cfg.val_every}"),
        (cfg.on_missing in ("error", "skip"), "--on-missing must be 'error' or 'skip'"),
        (cfg.monitor_metric in ("val_accuracy", "val_loss"),
         "--monitor must be 'val_accuracy' or 'val_loss'"),
        (cfg.precision in ("auto", "fp32", "bf16"), "--precision must be auto, fp32 or bf16"),
        (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"),
         f"--device must be auto, cpu or cuda, got {cfg.device!r}"),
        (cfg.aug_backend in ("fused", "keras", "gpu"),
         f"--aug-backend must be fused, keras or gpu, got {cfg.aug_backend!r}"),
        (cfg.workers == "auto" or str(cfg.workers).isdigit(),
         f"--workers must be 'auto' or a whole number, got {cfg.workers!r}"),
        (cfg.gpu_memory_fraction is None or 0 < cfg.gpu_memory_fraction <= 1,
         "--gpu-memory-fraction must be in (0, 1]"),
        (cfg.max_image_pixels >= 0, "--max-image-pixels must be >= 0 (0: no limit)"),
    ]
    for ok, message in checks:
        if not ok:
            raise StepscopeError(message)


def default_run_dir(cfg: TrainConfig, now: _dt.datetime | None = None) -> Path:
    """``runs/<name>-<time>`` unless ``--out`` was given."""
    if cfg.out:
        return Path(cfg.out)
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.name or cfg.model}-{stamp}"


def save_config(cfg: TrainConfig, path: Path, *, header: str = "") -> None:
    """Write the resolved configuration as YAML (``--config`` reads it back), after an
    optional comment ``header``."""
    atomic_write_text(path, header + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
