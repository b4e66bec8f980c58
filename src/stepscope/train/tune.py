"""``stepscope tune``: measure, on the user's data and machine, which input-pipeline and precision
settings train fastest, within a time budget, and write them as a config ``train`` can load.

Three kinds of measurement, cheapest first, each given a share of ``budget_s``:

1. **compute ceilings**: the frozen trunk's forward pass on batches already in memory, for each
   precision (fp32, and bf16 where it pays) and memory layout (channels_last on/off);
2. **loader-only throughput**: a DataLoader over the real training files with the real
   augmentation, for each worker count (0, 1, 2, 4, … up to the usable cores) and augmentation
   backend (fused, keras; gpu on CUDA, where the workers only decode and resize), nothing
   consuming the batches but the clock;
3. **short real runs**: ``train()`` for a few steps of the most promising candidates (ranked by
   the first two), timed by the recorder like any run; only these decide the winner.

Everything not measured because the budget ran out is named in the result's notes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import cv2
import torch
from torch.utils.data import DataLoader

from stepscope import policy
from stepscope.errors import DataError
from stepscope.observe.monitor import DEFAULT_WARMUP_STEPS
from stepscope.reports import TunedSettings, TuneResultDict
from stepscope.train import augment, ceilings, data, precision, setup
from stepscope.train import tune_plan as tp
from stepscope.train.config import TrainConfig, save_config
from stepscope.train.loop import train
from stepscope.train.models import create_model
from stepscope.train.tune_plan import Clock

ProgressFn = Callable[[str, float], None]
# Reads a short recorded run's rate (``analysis.tune.run_rate``); handed in by the caller, since
# train/ neither reads stores nor decides (analysis/ does): (chunk rates, data-wait share,
# steady seconds, steady steps).
RateReader = Callable[[Path], tuple[list[float], float, float, int]]
# Reads the capacity model's speed-up per worker count from the baseline run's stage capacities
# (``analysis.tune.run_workers_curve``, the curve ``compare`` uses); handed in for the same reason.
CurveReader = Callable[[Path], dict[str, float]]

# The config keys tune chooses; everything else in the user's config is kept as given.
TUNED_KEYS = ("workers", "prefetch", "aug_backend", "precision", "channels_last")


@dataclass
class TuneRow:
    """One measurement (or one skipped measurement) of the tune.

    Attributes:
        kind: ``"compute"`` (trunk forward ceiling), ``"loader"`` (DataLoader only) or ``"run"``
            (a short real training run).
        label: what was measured, in words.
        changes: the config keys this row differs in from the user's config (for ``"run"``
            rows: the candidate's tuned keys, all of them).
        images_per_s: median rate over the timed chunks; None when skipped.
        min_images_per_s: slowest timed chunk.
        max_images_per_s: fastest timed chunk.
        measured: what one image's time includes, and how many chunks were timed.
        seconds: time the measurement took, start-up included.
        predicted_images_per_s: for ``"run"`` rows, what the ceilings predicted.
        capacity_speedup: for ``"run"`` rows that change only the worker count, the speed-up
            over the baseline run the capacity model predicts from the baseline's stage
            capacities (``analysis.tune.predicted_vs_achieved``); None otherwise.
        achieved_speedup: for measured ``"run"`` rows but the baseline, this run's rate ÷ the
            baseline run's.
        data_wait_frac: for ``"run"`` rows, share of steady step time spent waiting for data.
        baseline: this run used the user's own settings.
        winner: this run won.
        skipped: why the row was not measured (None when it was).
    """

    kind: str
    label: str
    changes: TunedSettings
    images_per_s: float | None = None
    min_images_per_s: float | None = None
    max_images_per_s: float | None = None
    measured: str = ""
    seconds: float = 0.0
    predicted_images_per_s: float | None = None
    capacity_speedup: float | None = None
    achieved_speedup: float | None = None
    data_wait_frac: float | None = None
    baseline: bool = False
    winner: bool = False
    skipped: str | None = None


@dataclass
class TuneResult:
    """What ``tune`` found.

    Attributes:
        rows: every measurement, in the order taken.
        winner: the tuned config keys (``TUNED_KEYS``) to train with.
        reason: one sentence saying why the winner won, with its measured figures.
        notes: what was not measured and why, and caveats on the figures.
        budget_s: the time budget asked for.
        elapsed_s: the time the tune took.
        device: where training ran (``"cpu"``, ``"cuda"``).
        baseline_workers_curve: the capacity model's predicted speed-up per worker count
            (``"1"``..``"16"``) from the baseline run's stage capacities; empty when not read.
    """

    rows: list[TuneRow]
    winner: TunedSettings
    reason: str
    notes: list[str] = field(default_factory=list)
    budget_s: float = 0.0
    elapsed_s: float = 0.0
    device: str = "cpu"
    baseline_workers_curve: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> TuneResultDict:
        return cast("TuneResultDict", dataclasses.asdict(self))  # fields one for one (reports.py)

    def decide(self, best: TuneRow | None, reason: str, notes: Sequence[str] = ()) -> None:
        """Take analysis's decision (``analysis.tune.choose_winner``): mark the winning row and
        make its settings the winner; without one the user's own settings stay."""
        if best is not None:
            best.winner = True
            self.winner = best.changes.copy()
        self.reason = reason
        self.notes.extend(notes)

    def price(self, gains: Sequence[tuple[float | None, float | None]]) -> None:
        """Take analysis's predicted and achieved speed-ups (``analysis.tune
        .predicted_vs_achieved``), one pair per row in order."""
        for row, (predicted, achieved) in zip(self.rows, gains, strict=True):
            row.capacity_speedup, row.achieved_speedup = predicted, achieved


@dataclass(frozen=True)
class Candidate:
    """One combination of the tuned settings."""

    workers: int
    prefetch: int
    aug_backend: str  # fused | keras | gpu (CUDA only: workers decode, the device augments)
    precision: str  # "fp32" | "bf16": resolved, never "auto"
    channels_last: bool

    def changes(self) -> TunedSettings:
        """The candidate as TrainConfig keys (``workers`` is a string there, as on the CLI)."""
        return {"workers": str(self.workers), "prefetch": self.prefetch,
                "aug_backend": self.aug_backend, "precision": self.precision,
                "channels_last": self.channels_last}

    def label(self) -> str:
        layout = "channels_last" if self.channels_last else "NCHW"
        prefetch = f", prefetch {self.prefetch}" if self.workers else ""
        return (f"{self.workers} worker(s){prefetch}, {self.aug_backend} augment, "
                f"{self.precision} {layout}")


# --------------------------------------------------------------------------- pure helpers


def worker_counts(cores: int, also: int | None = None) -> list[int]:
    """Worker counts worth measuring: 0, 1, 2, 4, … up to ``cores``, plus ``also``.

    Examples:
        >>> worker_counts(2), worker_counts(16, also=6)
        ([0, 1, 2], [0, 1, 2, 4, 6, 8, 16])
    """
    counts = {0, max(cores, 1)}
    n = 1
    while n < cores:
        counts.add(n)
        n *= 2
    if also is not None:
        counts.add(also)
    return sorted(counts)


# --------------------------------------------------------------------------- measurements


def _compute_combos(device: torch.device, base: Candidate) -> list[tuple[str, bool]]:
    """(precision, channels_last) pairs to time, the user's own first: if the budget runs out,
    the baseline's prediction is the one we most need."""
    precisions = ["fp32", "bf16"] if precision.bf16_pays(device) else ["fp32"]
    combos = [(p, cl) for p in precisions for cl in (True, False)]
    first = (base.precision, base.channels_last)
    return [first] + [c for c in combos if c != first] if first in combos else combos


def _compute_stage(cfg: TrainConfig, device: torch.device, base: Candidate, threads: int,
                   budget: tp.Budget, say: Callable[[str], None]
                   ) -> tuple[list[TuneRow], dict[tuple[str, bool], float], float]:
    """Forward ceilings per (precision, channels_last); returns rows, rates, model build time."""
    deadline = budget.budget_s * tp.COMPUTE_SHARE
    combos = _compute_combos(device, base)
    say(f"building {cfg.model} (random weights: speed does not depend on them)")
    t0 = budget.clock()
    net = create_model(cfg.model, weights="none")
    build_s = budget.clock() - t0
    rows: list[TuneRow] = []
    rates: dict[tuple[str, bool], float] = {}
    for i, (prec, cl) in enumerate(combos):
        layout = "channels_last" if cl else "NCHW"
        row = TuneRow("compute", f"trunk forward, {prec} {layout}",
                      {"precision": prec, "channels_last": cl})
        rows.append(row)
        left = deadline - budget.elapsed()
        if left <= 0:
            row.skipped = "compute share of the budget spent"
            continue
        say(f"timing the trunk: {prec}, {layout}")
        if not cl:  # forward_ceiling converts to channels_last in place; undo it for NCHW
            net = net.to(memory_format=torch.contiguous_format)
        t1 = budget.clock()
        # Each measurement also runs one untimed warm-up batch (oneDNN picks its kernels there)
        # and at least two timed ones: give the timed part only half of its share.
        c = ceilings.forward_ceiling(net, img_size=cfg.img_size, batch_size=cfg.batch_size,
                                     device=device, precision="bf16" if prec == "bf16" else "fp32",
                                     channels_last=cl, seconds=0.5 * left / (len(combos) - i),
                                     threads=threads, clock=budget.clock)
        rates[(prec, cl)] = c.images_per_s
        row.images_per_s, row.seconds = c.images_per_s, budget.clock() - t1
        row.min_images_per_s, row.max_images_per_s = c.min_images_per_s, c.max_images_per_s
        row.measured = f"{c.includes}; {c.batches} batches of {c.batch_size}"
    return rows, rates, build_s


def _backends(device: torch.device) -> list[str]:
    """Augmentation backends worth measuring on ``device``."""
    return ["fused", "keras", "gpu"] if device.type == "cuda" else ["fused", "keras"]


def _loader(cfg: TrainConfig, items: list[data.Item], backend: str, workers: int
            ) -> DataLoader[Any]:
    # --aug-backend gpu: the workers decode and resize only, the device augments (gpuaug).
    params = None if backend == "gpu" else augment.resolve_augment(cfg.augment)
    transform = augment.create_transform(params, cfg.img_size, train=True,
                                         backend="keras" if backend == "keras" else "fused",
                                         seed=cfg.seed)
    # free-form: DataLoader keyword arguments handed on
    extra: dict[str, Any] = {}
    if workers > 0:
        # Persistent workers: the dataset may be a few batches long, and re-forking the workers
        # at every epoch turnover would time process start-up, not loading.
        extra = {"prefetch_factor": cfg.prefetch, "persistent_workers": True}
    return DataLoader(data.ImageDataset(items, transform), batch_size=cfg.batch_size,
                      shuffle=True, num_workers=workers, collate_fn=data.collate_skip_bad,
                      generator=torch.Generator().manual_seed(cfg.seed), **extra)


def time_loader(loader: DataLoader[Any], *, seconds: float, min_batches: int, clock: Clock
                ) -> tuple[list[float], list[int], float]:
    """Iterate ``loader`` (over as many epochs as needed) until ``seconds`` of timed batches and
    at least ``min_batches``; the first batch (worker start-up) is untimed.

    Returns:
        (seconds per batch, images per batch, warm-up seconds)
    """
    if len(loader) == 0:
        raise DataError("tune: the training set is empty; nothing to load")
    times: list[float] = []
    sizes: list[int] = []
    warmup_s: float | None = None
    it = iter(loader)
    t0 = clock()
    while sum(times) < seconds or len(times) < min_batches:
        batch = next(it, None)
        if batch is None:
            # The epoch turnover's wait counts toward the next batch, as in training.
            it = iter(loader)
            continue
        t1 = clock()
        if warmup_s is None:
            warmup_s = t1 - t0
        else:
            times.append(t1 - t0)
            sizes.append(len(batch.labels))
        t0 = t1
    del it  # shuts the persistent workers down
    return times, sizes, warmup_s or 0.0


def _loader_row(cfg: TrainConfig, split: data.DatasetSplit, backend: str, workers: int,
                seconds: float, clock: Clock) -> TuneRow:
    """Time one loader configuration; its row."""
    t0 = clock()
    times, sizes, _warm = time_loader(_loader(cfg, split.train, backend, workers),
                                      seconds=seconds, min_batches=2 * max(workers, 1),
                                      clock=clock)
    r = policy.chunk_rates(times, sizes, workers)
    work = ("decode + resize (the device augments)" if backend == "gpu"
            else f"decode + {cfg.augment} augment")
    return TuneRow(
        "loader", f"loader only, {workers} worker(s), {backend} augment",
        {"workers": str(workers), "aug_backend": backend}, statistics.median(r), min(r), max(r),
        f"read + {work} + collate at {cfg.img_size} px, {len(times)} batches of "
        f"{cfg.batch_size} in {len(r)} chunks; nothing consumes the batches (in training the "
        "trunk competes for the cores)", clock() - t0)


def _loader_stage(cfg: TrainConfig, split: data.DatasetSplit, base: Candidate,
                  device: torch.device, cores: int, budget: tp.Budget, say: Callable[[str], None]
                  ) -> tuple[list[TuneRow], dict[tuple[str, int], float]]:
    """Loader-only images per second per (backend, workers), the user's backend first."""
    deadline = budget.budget_s * (tp.COMPUTE_SHARE + tp.LOADER_SHARE)
    backends = [base.aug_backend] + [b for b in _backends(device) if b != base.aug_backend]
    plan = [(b, w) for b in backends for w in worker_counts(cores, also=base.workers)]
    rows: list[TuneRow] = []
    before = cv2.getNumThreads()
    # One OpenCV thread per process, set before the workers fork (setup._single_threaded_opencv).
    cv2.setNumThreads(1)
    try:
        for i, (backend, workers) in enumerate(plan):
            left = deadline - budget.elapsed()
            if left <= 0:
                rows.append(TuneRow("loader", f"loader only, {workers} worker(s), {backend} "
                                    "augment", {"workers": str(workers), "aug_backend": backend},
                                    skipped="loader share of the budget spent"))
                continue
            say(f"timing the loader: {workers} worker(s), {backend} augmentation")
            # Worker start-up and the untimed first batch come on top: time half the share.
            rows.append(_loader_row(cfg, split, backend, workers, 0.5 * left / (len(plan) - i),
                                    budget.clock))
    finally:
        cv2.setNumThreads(before)
    rates = {(r.changes["aug_backend"], int(r.changes["workers"])): r.images_per_s
             for r in rows if r.images_per_s is not None}
    return rows, rates


# --------------------------------------------------------------------------- real runs


def _rank(cands: Sequence[Candidate], base: Candidate, loader: dict[tuple[str, int], float],
          compute: dict[tuple[str, bool], float], cores: int, shared: bool
          ) -> list[tuple[Candidate, float | None]]:
    """The baseline first, then the others by predicted rate (unpredictable ones dropped)."""
    def predict(c: Candidate) -> float | None:
        lw, l0 = loader.get((c.aug_backend, c.workers)), loader.get((c.aug_backend, 0))
        cp = compute.get((c.precision, c.channels_last))
        if lw is None or l0 is None or cp is None:
            return None
        return policy.predict_images_per_s(loader_w=lw, loader_0=l0, compute=cp, workers=c.workers,
                                    cores=cores, shared_cores=shared)

    scored = [(c, predict(c)) for c in cands if c != base]
    ranked = sorted(((c, p) for c, p in scored if p is not None), key=lambda cp: -(cp[1] or 0.0))
    return [(base, predict(base)), *ranked]


def _real_run(cfg: TrainConfig, cand: Candidate, steps: int, run_dir: Path) -> None:
    run_cfg = dataclasses.replace(
        cfg, **cand.changes(), epochs=1, max_steps=steps, out=str(run_dir), name=run_dir.name,
        resume=None, monitor=True,
        # Speed does not depend on the weights' values: random ones spare loading them.
        weights="none",
        # epochs=1 with val_every=2: the validation pass is skipped, its time is not ours to spend.
        val_every=2,
    )
    train(run_cfg)


def _fastest(rows: Sequence[TuneRow]) -> TuneRow | None:
    """The fastest real run measured so far (the stage refines it; analysis words the choice)."""
    runs = [r for r in rows if r.kind == "run" and r.images_per_s is not None]
    return max(runs, key=lambda r: r.images_per_s or 0.0) if runs else None


@dataclass
class _RunPlan:
    """What the real-run stage knows while it goes: budget, costs learnt so far, results."""

    cfg: TrainConfig
    budget: tp.Budget
    tmp: Path
    epoch_steps: int
    overhead_s: float  # model build + monitor and loader start; calibrated after each run
    fallback_rate: float  # images/s guessed for a candidate nothing predicts
    read_rate: RateReader
    rows: list[TuneRow] = field(default_factory=list)
    read_curve: CurveReader | None = None
    baseline_curve: dict[str, float] = field(default_factory=dict)


def _try_run(plan: _RunPlan, cand: Candidate, predicted: float | None, *, baseline: bool,
             share: int, say: Callable[[str], None]) -> None:
    """One real run of ``cand`` in 1/``share`` of the budget left, or a skipped row."""
    cfg, budget = plan.cfg, plan.budget
    rate_guess = predicted or plan.fallback_rate
    need_s = tp.run_need_s(plan.overhead_s, cfg.batch_size, rate_guess)
    left = budget.left() - tp.RESERVE_S
    row = TuneRow("run", cand.label(), cand.changes(), predicted_images_per_s=predicted,
                  baseline=baseline)
    if need_s > left:
        row.skipped = f"needs ~{need_s:.0f} s, {max(left, 0):.0f} s left"
        plan.rows.append(row)
        return
    steps = tp.plan_steps(left / share, plan.overhead_s, rate_guess, cfg.batch_size,
                        plan.epoch_steps)
    say(f"real run: {cand.label()}, {steps} steps")
    run_dir = plan.tmp / f"run{len(plan.rows)}"
    t0 = budget.clock()
    _real_run(cfg, cand, steps, run_dir)
    row.seconds = budget.clock() - t0
    rates, wait, steady_s, n = plan.read_rate(run_dir)
    plan.overhead_s = max(0.5, row.seconds - steady_s * steps / max(n, 1))
    if not rates:
        row.skipped = "the run recorded no training step (every image unreadable?)"
    else:
        row.images_per_s, row.data_wait_frac = statistics.median(rates), wait
        row.min_images_per_s, row.max_images_per_s = min(rates), max(rates)
        row.measured = (f"train() for {steps} steps, {n} steady after {DEFAULT_WARMUP_STEPS} "
                        "warm-up; step = data wait + copy + forward/backward/update, as recorded")
        if baseline and plan.read_curve is not None:
            # Read now: the run's store goes with the temporary folder. The prediction is an
            # extra column: a store it cannot read must not cost the user the tune.
            try:
                plan.baseline_curve = plan.read_curve(run_dir)
            except Exception as exc:
                plan.baseline_curve = {}
                say(f"no capacity prediction: the baseline run could not be read ({exc})")
    plan.rows.append(row)


def _runs_stage(plan: _RunPlan, ranked: list[tuple[Candidate, float | None]],
                say: Callable[[str], None], notes: list[str]) -> list[TuneRow]:
    """The baseline and the best-ranked candidates, then the best with twice the prefetch."""
    n = tp.MAX_REAL_RUNS - 1  # the last run is the prefetch refinement
    todo = ranked[:n]
    for i, (cand, predicted) in enumerate(todo):
        _try_run(plan, cand, predicted, baseline=i == 0, share=len(todo) - i + 1, say=say)
    if len(ranked) > n:
        notes.append(f"{len(ranked) - n} lower-ranked candidate(s) got no real run (at most "
                     f"{tp.MAX_REAL_RUNS} runs in all), e.g. {ranked[n][0].label()}")
    best = _fastest(plan.rows)
    if best is not None and int(best.changes["workers"]) > 0:
        # Deeper prefetch only helps when loading is bursty; the ceilings cannot predict it,
        # so it gets a real run of its own if the budget allows.
        cand = Candidate(int(best.changes["workers"]), 2 * int(best.changes["prefetch"]),
                         best.changes["aug_backend"], best.changes["precision"],
                         best.changes["channels_last"])
        _try_run(plan, cand, best.images_per_s, baseline=False, share=1, say=say)
    return plan.rows


# --------------------------------------------------------------------------- entry point


def baseline_candidate(cfg: TrainConfig, device: torch.device, cores: int) -> Candidate:
    """The user's own settings, resolved as ``train`` resolves them."""
    backend = cfg.aug_backend if cfg.aug_backend in _backends(device) else "fused"
    workers = setup.resolve_workers(cfg.workers, cores=cores, device=device, backend=backend)
    bf16 = policy.use_bf16(cfg.precision, precision.bf16_pays(device))
    return Candidate(workers, cfg.prefetch, backend, "bf16" if bf16 else "fp32", cfg.channels_last)


def _candidates(base: Candidate, loader: dict[tuple[str, int], float],
                compute: dict[tuple[str, bool], float]) -> list[Candidate]:
    return [Candidate(w, base.prefetch, b, p, cl)
            for (b, w) in loader for (p, cl) in compute]


def tune(cfg: TrainConfig, *, read_rate: RateReader, budget_s: float = 120.0,
         progress: ProgressFn | None = None, clock: Clock = time.perf_counter,
         read_curve: CurveReader | None = None) -> TuneResult:
    """Measure which settings train ``cfg`` fastest here, in about ``budget_s`` seconds.

    The result's ``winner`` is the user's own settings until :meth:`TuneResult.decide` takes
    analysis's choice (``analysis.tune.choose_winner``; the CLI wires the two).

    Args:
        cfg: the user's resolved training config (data, model, image size, batch size...).
        read_rate: reads a short run's rate from its store (``analysis.tune.run_rate``).
        budget_s: wall-clock budget for the whole tune; what does not fit is skipped and named.
        progress: called with (what is being measured, fraction of the budget spent).
        clock: injectable clock.
        read_curve: reads the capacity model's speed-up per worker count from the baseline
            run (``analysis.tune.run_workers_curve``); None skips the prediction.

    Returns:
        The measurements and what was not measured.

    Raises:
        DataError, ModelError: as ``train`` would for the same config.

    Examples:
        >>> result = tune(cfg, read_rate=run_rate, budget_s=60)  # doctest: +SKIP
        >>> result.decide(*choose_winner(result.rows), skip_notes(result.rows))  # doctest: +SKIP
        >>> write_tuned_config(result, cfg, Path("tuned.yaml"))  # doctest: +SKIP
    """
    budget = tp.Budget(budget_s, clock)

    def say(text: str) -> None:
        if progress is not None:
            progress(text, budget.fraction())

    device = setup.resolve_device(cfg.device)
    cores = setup.usable_cores()
    threads_before = torch.get_num_threads()
    split = _resolve_split(cfg)
    base = baseline_candidate(cfg, device, cores)
    notes = _static_notes(cfg, device)
    try:
        c_rows, compute, build_s = _compute_stage(cfg, device, base, cfg.threads or cores, budget,
                                                   say)
        l_rows, loader = _loader_stage(cfg, split, base, device, cores, budget, say)
        ranked = _rank(_candidates(base, loader, compute), base, loader, compute, cores,
                       shared=device.type == "cpu")
        known = [*loader.values(), *compute.values()]
        with tempfile.TemporaryDirectory(prefix="stepscope-tune-") as tmp:
            plan = _RunPlan(cfg, budget, Path(tmp), math.ceil(len(split.train) / cfg.batch_size),
                            overhead_s=build_s + 2.0, fallback_rate=min(known, default=1.0),
                            read_rate=read_rate, read_curve=read_curve)
            r_rows = _runs_stage(plan, ranked, say, notes)
    finally:
        torch.set_num_threads(threads_before)
    say("done")
    return TuneResult(c_rows + l_rows + r_rows, base.changes(), "", notes, budget_s,
                      budget.elapsed(), device.type, plan.baseline_curve)


def _resolve_split(cfg: TrainConfig) -> data.DatasetSplit:
    return data.resolve_dataset(
        csv=Path(cfg.csv) if cfg.csv else None,
        val_csv=Path(cfg.val_csv) if cfg.val_csv else None,
        images=Path(cfg.images) if cfg.images else None, x_col=cfg.x_col, y_col=cfg.y_col,
        folder=Path(cfg.folder) if cfg.folder else None, val_split=cfg.val_split, seed=cfg.seed,
        on_missing="skip" if cfg.on_missing == "skip" else "error",
        follow_links=cfg.follow_links,
    )


def _static_notes(cfg: TrainConfig, device: torch.device) -> list[str]:
    notes = [
        "feature_cache is not tuned: it serves validation (and training without augmentation) "
        "from the second epoch on, which a one-epoch tune run never reaches; kept as given "
        f"({cfg.feature_cache})",
        "the keras augmentation backend is the bit-faithful reference; fused draws the same "
        "transforms in one OpenCV warp (same distributions, not the same pixels)",
    ]
    if not precision.bf16_pays(device):
        notes.append(f"bf16 not measured: it does not pay on this {device.type} "
                     "(no native bf16 support)")
    if cfg.unfreeze:
        notes.append("compute ceilings time the forward pass only; with unfrozen stages the "
                     "backward pass adds to each real run")
    return notes


def write_tuned_config(result: TuneResult, base_cfg: TrainConfig, path: Path) -> TrainConfig:
    """Write ``base_cfg`` with the winner's settings as a YAML ``stepscope train --config`` loads.

    ``resume`` is cleared (a tuned config starts runs, it does not continue one); every other
    key keeps the user's value. Returns the merged config.

    Examples:
        >>> write_tuned_config(result, cfg, Path("tuned.yaml"))  # doctest: +SKIP
    """
    merged = dataclasses.replace(base_cfg, **result.winner, resume=None)
    header = f"# written by stepscope tune ({result.elapsed_s:.0f} s on {result.device}): "
    save_config(merged, Path(path), header=header + " ".join(result.reason.split()) + "\n")
    return merged
