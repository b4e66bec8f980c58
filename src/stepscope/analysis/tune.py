"""``stepscope tune``'s decisions and words: which real run won and why, what was skipped, and
the rate of a recorded run. The measuring is ``train/tune.py``'s; it hands its rows here by
shape (the protocol below), since analysis/ does not import train/.

Examples:
    >>> from types import SimpleNamespace as Row
    >>> base = Row(kind="run", label="0 workers", images_per_s=50.0, min_images_per_s=45.0,
    ...            max_images_per_s=55.0, data_wait_frac=0.6, baseline=True, skipped=None)
    >>> fast = Row(kind="run", label="2 workers", images_per_s=120.0, min_images_per_s=110.0,
    ...            max_images_per_s=125.0, data_wait_frac=0.05, baseline=False, skipped=None)
    >>> choose_winner([base, fast])[0].label
    '2 workers'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

from stepscope.analysis.fmt import fmt_pct, fmt_rate, fmt_ratio
from stepscope.analysis.summary import build_summary
from stepscope.policy import chunk_rates, steady_steps
from stepscope.reports import TunedSettings
from stepscope.store.db import RunReader

# A step that waited for data this share of its time or more was held back by loading.
WAIT_WORTH_SAYING_FRAC = 0.2


class TuneRowLike(Protocol):
    """What the decision reads from one measurement (``stepscope.train.tune.TuneRow``)."""

    @property
    def kind(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def changes(self) -> TunedSettings: ...
    @property
    def images_per_s(self) -> float | None: ...
    @property
    def min_images_per_s(self) -> float | None: ...
    @property
    def max_images_per_s(self) -> float | None: ...
    @property
    def data_wait_frac(self) -> float | None: ...
    @property
    def baseline(self) -> bool: ...
    @property
    def skipped(self) -> str | None: ...


RowT = TypeVar("RowT", bound=TuneRowLike)


def _spread(row: TuneRowLike) -> str:
    if row.min_images_per_s is None or row.max_images_per_s is None:
        return ""
    return f" ({fmt_rate(row.min_images_per_s)}–{fmt_rate(row.max_images_per_s)})"


def choose_winner(rows: Sequence[RowT]) -> tuple[RowT | None, str]:
    """The fastest measured real run, and one sentence saying why it won (its figures inline)."""
    runs = [r for r in rows if r.kind == "run" and r.images_per_s is not None]
    if not runs:
        return None, "no real run finished within the budget, so nothing was confirmed"
    best = max(runs, key=lambda r: r.images_per_s or 0.0)
    base = next((r for r in runs if r.baseline), None)
    figure = f"{fmt_rate(best.images_per_s)} img/s{_spread(best)}"
    if base is None:
        return best, f"{best.label} trained fastest of the runs measured, at {figure}"
    if best is base:
        return best, (f"your current settings ({best.label}) trained fastest, at {figure}; "
                      "no candidate beat them on this machine")
    ratio = (best.images_per_s or 0.0) / max(base.images_per_s or 0.0, 1e-9)
    why = (f"{best.label} trained at {figure}, {fmt_ratio(ratio)} your current settings' "
           f"{fmt_rate(base.images_per_s)} img/s{_spread(base)}")
    b_wait, w_wait = base.data_wait_frac, best.data_wait_frac
    if b_wait is not None and w_wait is not None and b_wait >= WAIT_WORTH_SAYING_FRAC \
            and w_wait < b_wait:
        why += (f": with your settings each step waited for data {fmt_pct(b_wait)} of its "
                f"time, with these {fmt_pct(w_wait)}")
    if (best.min_images_per_s or 0.0) <= (base.max_images_per_s or 0.0):
        why += " (the spreads overlap: the gain is within this machine's noise)"
    return best, why


def skip_notes(rows: Sequence[TuneRowLike]) -> list[str]:
    """One note naming what the budget did not allow (empty when everything was measured)."""
    skipped = [r for r in rows if r.skipped]
    if not skipped:
        return []
    names = "; ".join(f"{r.label} ({r.skipped})" for r in skipped[:6])
    more = f" and {len(skipped) - 6} more" if len(skipped) > 6 else ""
    return [f"budget ran out: skipped {len(skipped)} measurement(s): {names}{more}"]


class RunRate(NamedTuple):
    """A short recorded run's training rate over its steady steps."""

    chunk_rates: list[float]
    data_wait_frac: float
    steady_s: float
    steady_steps: int


def run_rate(run_dir: Path) -> RunRate:
    """Chunk rates, data-wait share, steady seconds and steady step count of a recorded run.

    Steady state: the training phase's steps after the recorder's warm-up steps
    (:func:`stepscope.policy.steady_steps`).
    """
    with RunReader(run_dir) as reader:
        ids = {p.phase_id for p in reader.phases() if p.phase == "train"}
        steps = [s for s in reader.steps() if s.phase_id in ids]
        workers = max((p.workers or 0 for p in reader.phases()), default=0)
    steady, _ = steady_steps(steps)
    wall = [s.wall_s for s in steady]
    # Chunks of one step per worker smooth the workers' bursts, but a short run needs at least
    # three chunks for its spread to mean anything.
    rates = chunk_rates(wall, [s.images for s in steady], max(1, min(workers, len(steady) // 3)))
    wait = sum(s.data_wait_s for s in steady) / max(sum(wall), 1e-9)
    return RunRate(rates, wait, sum(wall), len(steady))


def run_workers_curve(run_dir: Path) -> dict[str, float]:
    """The capacity model's predicted speed-up per worker count, from a recorded run's stage
    capacities: the training phase's ``workers_curve`` (``analysis.capacity.workers_curve``,
    the curve ``compare`` reads). Empty when the run recorded no stage timing.
    """
    with RunReader(run_dir) as reader:
        summary = build_summary(reader)
    trains = [p for p in summary.get("phases") or []
              if p.get("phase") == "train" and p.get("workers_curve")]
    if not trains:
        return {}
    # The phase with the most steady steps: its capacities rest on the most batches.
    best = max(trains, key=lambda p: p.get("steady_steps") or 0)
    return {str(k): float(v) for k, v in best["workers_curve"].items()}


class Gain(NamedTuple):
    """One real run against the user's: what the capacity model predicted, what was measured."""

    predicted: float | None  # speed-up the baseline's capacities predict (worker count only)
    achieved: float | None  # this run's rate ÷ the baseline run's


def predicted_vs_achieved(rows: Sequence[TuneRowLike], curve: dict[str, float]) -> list[Gain]:
    """For each row (in order): the capacity model's predicted speed-up over the baseline run
    and the measured one.

    The model prices the worker count only, so a run gets a prediction only when the worker
    count is all that differs from the baseline (a precision, layout, backend or prefetch change
    beside it would be a gain the model never saw). Rows that are not measured real runs, and
    the baseline itself, get neither.

    Examples:
        >>> from types import SimpleNamespace as Row
        >>> cfg = {"workers": "0", "aug_backend": "fused"}
        >>> base = Row(kind="run", images_per_s=50.0, baseline=True, changes=cfg)
        >>> two = Row(kind="run", images_per_s=100.0, baseline=False, changes={**cfg, "workers": "2"})
        >>> predicted_vs_achieved([base, two], {"2": 1.8})[1]
        Gain(predicted=1.8, achieved=2.0)
    """
    base = next((r for r in rows if r.kind == "run" and r.baseline and r.images_per_s), None)
    out: list[Gain] = []
    for r in rows:
        if base is None or r is base or r.kind != "run" or r.images_per_s is None:
            out.append(Gain(None, None))
            continue
        differ = {k for k in {*r.changes, *base.changes}
                  if str(r.changes.get(k)) != str(base.changes.get(k))}
        predicted = curve.get(str(r.changes.get("workers"))) if differ == {"workers"} else None
        out.append(Gain(predicted, r.images_per_s / (base.images_per_s or 1.0)))
    return out


__all__ = ["Gain", "RunRate", "TuneRowLike", "choose_winner", "predicted_vs_achieved",
           "run_rate", "run_workers_curve", "skip_notes"]
