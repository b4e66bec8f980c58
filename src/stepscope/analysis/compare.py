"""Two runs side by side: what a change (more workers, a cheaper augmentation, a warm cache) did.

Works on two ``summary.json`` dicts (DESIGN.md schema 1), so it compares any two runs, even
ones recorded by different stepscope versions that kept the schema. Phases are matched by
(epoch, phase); a phase present in only one run is listed, not guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stepscope.analysis.contracts_summary import PhaseRow, Summary


@dataclass(frozen=True)
class PhaseDelta:
    """One (epoch, phase) in both runs. ``ratio`` = b img/s ÷ a img/s (> 1: b is faster)."""

    epoch: int
    phase: str
    a_images_per_s: float | None
    b_images_per_s: float | None
    ratio: float | None
    a_data_wait_frac: float | None
    b_data_wait_frac: float | None
    data_wait_change: float | None
    a_verdict: str | None
    b_verdict: str | None
    a_input_cause: str | None
    b_input_cause: str | None

    @property
    def verdict_changed(self) -> bool:
        return (self.a_verdict, self.a_input_cause) != (self.b_verdict, self.b_input_cause)


@dataclass(frozen=True)
class PredictedGain:
    """A fix run ``a`` predicted (from its stage capacities) beside what run ``b`` achieved."""

    epoch: int
    phase: str
    change: str
    predicted: float
    achieved: float

    @property
    def error_frac(self) -> float:
        """(predicted − achieved) ÷ achieved: +0.25 promised 25 % more than came."""
        return (self.predicted - self.achieved) / self.achieved


@dataclass(frozen=True)
class LedgerDelta:
    """One memory-ledger item in either run; a missing item counts as absent (None)."""

    item: str
    a_bytes: float | None
    b_bytes: float | None

    @property
    def delta_bytes(self) -> float | None:
        if self.a_bytes is None or self.b_bytes is None:
            return None
        return self.b_bytes - self.a_bytes


@dataclass(frozen=True)
class Comparison:
    """Run b measured against run a.

    Examples:
        >>> cmp = compare_summaries(json.load(open("runs/a/summary.json")),
        ...                         json.load(open("runs/b/summary.json")))
        >>> cmp.train_ratio  # b's overall training img/s ÷ a's
        2.4
    """

    a_name: str
    b_name: str
    phases: list[PhaseDelta]
    only_in_a: list[tuple[int, str]]
    only_in_b: list[tuple[int, str]]
    train_images_per_s_a: float | None
    train_images_per_s_b: float | None
    val_images_per_s_a: float | None
    val_images_per_s_b: float | None
    memory: list[LedgerDelta] = field(default_factory=list)
    memory_total_a: float | None = None
    memory_total_b: float | None = None
    findings_resolved: list[str] = field(default_factory=list)
    findings_new: list[str] = field(default_factory=list)
    predicted: list[PredictedGain] = field(default_factory=list)

    @property
    def train_ratio(self) -> float | None:
        return _ratio(self.train_images_per_s_a, self.train_images_per_s_b)

    @property
    def val_ratio(self) -> float | None:
        return _ratio(self.val_images_per_s_a, self.val_images_per_s_b)

    @property
    def verdict_changes(self) -> list[PhaseDelta]:
        return [p for p in self.phases if p.verdict_changed]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a <= 0:
        return None
    return b / a


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def overall_images_per_s(summary: Summary, phase: str) -> float | None:
    """All images of one phase kind over all its seconds (an epoch-weighted mean would let a
    short epoch count as much as a long one)."""
    rows = [p for p in summary.get("phases", []) if p.get("phase") == phase]
    images = sum(_num(p.get("images")) or 0.0 for p in rows)
    seconds = sum(_num(p.get("seconds")) or 0.0 for p in rows)
    return images / seconds if seconds > 0 and images > 0 else None


def _phase_delta(pa: PhaseRow, pb: PhaseRow) -> PhaseDelta:
    a_ips, b_ips = _num(pa.get("images_per_s")), _num(pb.get("images_per_s"))
    a_dw, b_dw = _num(pa.get("data_wait_frac")), _num(pb.get("data_wait_frac"))
    return PhaseDelta(
        epoch=int(pa["epoch"]), phase=str(pa["phase"]),
        a_images_per_s=a_ips, b_images_per_s=b_ips, ratio=_ratio(a_ips, b_ips),
        a_data_wait_frac=a_dw, b_data_wait_frac=b_dw, data_wait_change=_diff(a_dw, b_dw),
        a_verdict=pa.get("verdict"), b_verdict=pb.get("verdict"),
        a_input_cause=pa.get("input_cause"), b_input_cause=pb.get("input_cause"),
    )


def _ledger(summary: Summary) -> dict[str, float | None]:
    memory = summary.get("memory") or {}
    items: dict[str, float | None] = {
        str(row.get("item")): _num(row.get("bytes")) for row in memory.get("ledger") or []
    }
    if "unattributed_bytes" in memory:
        items["unattributed"] = _num(memory.get("unattributed_bytes"))
    return items


def _memory_deltas(a: Summary, b: Summary) -> list[LedgerDelta]:
    la, lb = _ledger(a), _ledger(b)
    order = list(la) + [k for k in lb if k not in la]
    return [LedgerDelta(k, la.get(k), lb.get(k)) for k in order]


def _finding_ids(summary: Summary) -> list[str]:
    return [str(f.get("id")) for f in summary.get("findings") or []]


def compare_summaries(a: Summary, b: Summary) -> Comparison:
    """Compare run ``b`` against run ``a`` (both ``summary.json`` dicts).

    Args:
        a: the baseline run's summary.
        b: the changed run's summary.

    Returns:
        Per-phase throughput ratios and data-wait changes, verdict changes, memory-ledger
        deltas, findings resolved/new, and the overall train and val img/s of each run.

    Examples:
        >>> cmp = compare_summaries(base, more_workers)
        >>> [(p.epoch, p.phase, round(p.ratio, 2)) for p in cmp.phases]
        [(1, 'train', 2.1), (1, 'val', 1.3)]
    """
    pa = {(int(p["epoch"]), str(p["phase"])): p for p in a.get("phases", [])}
    pb = {(int(p["epoch"]), str(p["phase"])): p for p in b.get("phases", [])}
    common = [k for k in pa if k in pb]
    mem_a, mem_b = a.get("memory") or {}, b.get("memory") or {}
    fa, fb = _finding_ids(a), _finding_ids(b)
    return Comparison(
        a_name=str((a.get("run") or {}).get("name", "a")),
        b_name=str((b.get("run") or {}).get("name", "b")),
        phases=[_phase_delta(pa[k], pb[k]) for k in common],
        only_in_a=[k for k in pa if k not in pb],
        only_in_b=[k for k in pb if k not in pa],
        train_images_per_s_a=overall_images_per_s(a, "train"),
        train_images_per_s_b=overall_images_per_s(b, "train"),
        val_images_per_s_a=overall_images_per_s(a, "val"),
        val_images_per_s_b=overall_images_per_s(b, "val"),
        memory=_memory_deltas(a, b),
        memory_total_a=_num(mem_a.get("total_bytes")),
        memory_total_b=_num(mem_b.get("total_bytes")),
        findings_resolved=[f for f in fa if f not in fb],
        findings_new=[f for f in fb if f not in fa],
        predicted=[g for k in common if (g := predicted_gain(pa[k], pb[k])) is not None],
    )


def _steady_rate(p: PhaseRow) -> float | None:
    cap = p.get("capacity")
    return None if cap is None else _num(cap.get("now_images_per_s"))


def predicted_gain(pa: PhaseRow, pb: PhaseRow) -> PredictedGain | None:
    """What ``a`` predicted for the loader change ``b`` made (workers, persistent_workers).

    Worker counts compare steady-state rates (the model's prediction is about them); keeping
    workers alive compares whole phases (the start-up is what it saves).
    """
    la, lb = pa.get("loader"), pb.get("loader")
    if not la or not lb:
        return None
    epoch, phase = int(pa["epoch"]), str(pa["phase"])
    wa, wb = la.get("workers"), lb.get("workers")
    if wa != wb and wb:
        predicted = _num((pa.get("workers_curve") or {}).get(str(wb)))
        achieved = _ratio(_steady_rate(pa), _steady_rate(pb))
        if predicted is not None and achieved:
            return PredictedGain(epoch, phase, f"num_workers {wa} → {wb}", predicted, achieved)
        return None
    if not la.get("persistent_workers") and lb.get("persistent_workers"):
        pred = next((q for q in pa.get("predictions") or []
                     if q.get("change") == "persistent_workers=True"), None)
        achieved = _ratio(_num(pa.get("images_per_s")), _num(pb.get("images_per_s")))
        if pred is not None and achieved:
            return PredictedGain(epoch, phase, "persistent_workers=True",
                                 float(pred["speedup"]), achieved)
    return None
