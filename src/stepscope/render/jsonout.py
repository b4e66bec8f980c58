"""The ``--json`` outputs of ``explain``, ``compare``, ``doctor`` and ``tune``: one object each,
with a ``schema`` name and a ``schema_version`` (documented in ``docs/json.md``).

A field is added without a version change; a field renamed, removed or changed in meaning bumps
``schema_version``. Missing measurements are ``null``, never a made-up number. Each builder here
is the only place its schema is spelled, and the tests check these builders against the doc.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, TypedDict

from stepscope.analysis.compare import Comparison
from stepscope.analysis.contracts_summary import Summary
from stepscope.reports import (
    CapabilityRow,
    Ceilings,
    CpuReport,
    DoctorReport,
    GpuReport,
    MemoryReport,
    StorageReport,
    TrainingPlan,
    TunedSettings,
    TuneResultDict,
    TuneRowDict,
)

EXPLAIN_SCHEMA = ("stepscope.explain", 1)
COMPARE_SCHEMA = ("stepscope.compare", 1)
DOCTOR_SCHEMA = ("stepscope.doctor", 1)
TUNE_SCHEMA = ("stepscope.tune", 1)


class SchemaHead(TypedDict):
    schema: str
    schema_version: int


class RunRef(TypedDict):
    """Which run an output is about (from ``summary["run"]``)."""

    name: str | None
    status: str | None
    device: str | None
    kind: str | None
    started: float | None
    ended: float | None


class AnswerJson(TypedDict):
    number: int
    title: str
    text: str


class ExplainJson(SchemaHead):
    run: RunRef
    answers: list[AnswerJson]


class RatesJson(TypedDict):
    a_images_per_s: float | None
    b_images_per_s: float | None
    ratio: float | None


class PhaseDeltaJson(TypedDict):
    epoch: int
    phase: str
    ratio: float | None
    a_images_per_s: float | None
    b_images_per_s: float | None
    a_data_wait_frac: float | None
    b_data_wait_frac: float | None
    data_wait_change: float | None
    a_verdict: str | None
    b_verdict: str | None
    a_input_cause: str | None
    b_input_cause: str | None
    verdict_changed: bool


class PhaseRefJson(TypedDict):
    epoch: int
    phase: str


class LedgerDeltaJson(TypedDict):
    item: str
    a_bytes: float | None
    b_bytes: float | None
    delta_bytes: float | None


class MemoryTotalJson(TypedDict):
    a_bytes: float | None
    b_bytes: float | None


class PredictedJson(TypedDict):
    epoch: int
    phase: str
    change: str
    predicted: float
    achieved: float
    error_frac: float


class CompareJson(SchemaHead):
    a: RunRef
    b: RunRef
    train: RatesJson
    val: RatesJson
    phases: list[PhaseDeltaJson]
    only_in_a: list[PhaseRefJson]
    only_in_b: list[PhaseRefJson]
    memory: list[LedgerDeltaJson]
    memory_total: MemoryTotalJson
    findings_resolved: list[str]
    findings_new: list[str]
    predicted: list[PredictedJson]


class _DoctorJsonCore(SchemaHead):
    cpu: CpuReport
    memory: MemoryReport
    gpu: GpuReport
    storage: StorageReport | None
    capabilities: list[CapabilityRow]
    training: TrainingPlan
    ceilings: Ceilings
    elapsed_s: float


class DoctorJson(_DoctorJsonCore, total=False):
    """The doctor's report with this JSON's schema head (the report's own schema_version
    gives way to it) and, where the CLI made them, the two predictions."""

    prediction: str
    cache_prediction: str | None


class TuneJson(SchemaHead):
    device: str
    budget_s: float
    elapsed_s: float
    winner: TunedSettings
    reason: str
    config_path: str | None
    rows: list[TuneRowDict]
    baseline_workers_curve: dict[str, float]
    notes: list[str]


def _run_ref(summary: Summary) -> RunRef:
    run = summary.get("run")
    if not run:
        return {"name": None, "status": None, "device": None, "kind": None, "started": None,
                "ended": None}
    return {"name": run.get("name"), "status": run.get("status"), "device": run.get("device"),
            "kind": run.get("kind"), "started": run.get("started"), "ended": run.get("ended")}


def explain_json(summary: Summary, answers: Sequence[Any]) -> ExplainJson:
    """``stepscope explain --json``: the run and its numbered answers."""
    return {
        "schema": EXPLAIN_SCHEMA[0], "schema_version": EXPLAIN_SCHEMA[1],
        "run": _run_ref(summary),
        "answers": [{"number": int(a.number), "title": str(a.title), "text": str(a.text)}
                    for a in answers],
    }


def compare_json(cmp: Comparison, a: Summary, b: Summary) -> CompareJson:
    """``stepscope compare --json``: run b against run a, phase by phase."""
    return {
        "schema": COMPARE_SCHEMA[0], "schema_version": COMPARE_SCHEMA[1],
        "a": _run_ref(a),
        "b": _run_ref(b),
        "train": {"a_images_per_s": cmp.train_images_per_s_a,
                  "b_images_per_s": cmp.train_images_per_s_b, "ratio": cmp.train_ratio},
        "val": {"a_images_per_s": cmp.val_images_per_s_a,
                "b_images_per_s": cmp.val_images_per_s_b, "ratio": cmp.val_ratio},
        "phases": [{
            "epoch": p.epoch, "phase": p.phase, "ratio": p.ratio,
            "a_images_per_s": p.a_images_per_s, "b_images_per_s": p.b_images_per_s,
            "a_data_wait_frac": p.a_data_wait_frac, "b_data_wait_frac": p.b_data_wait_frac,
            "data_wait_change": p.data_wait_change,
            "a_verdict": p.a_verdict, "b_verdict": p.b_verdict,
            "a_input_cause": p.a_input_cause, "b_input_cause": p.b_input_cause,
            "verdict_changed": p.verdict_changed,
        } for p in cmp.phases],
        "only_in_a": [{"epoch": e, "phase": ph} for e, ph in cmp.only_in_a],
        "only_in_b": [{"epoch": e, "phase": ph} for e, ph in cmp.only_in_b],
        "memory": [{"item": m.item, "a_bytes": m.a_bytes, "b_bytes": m.b_bytes,
                    "delta_bytes": m.delta_bytes} for m in cmp.memory],
        "memory_total": {"a_bytes": cmp.memory_total_a, "b_bytes": cmp.memory_total_b},
        "findings_resolved": list(cmp.findings_resolved),
        "findings_new": list(cmp.findings_new),
        "predicted": [{"epoch": g.epoch, "phase": g.phase, "change": g.change,
                       "predicted": g.predicted, "achieved": g.achieved,
                       "error_frac": g.error_frac} for g in cmp.predicted],
    }


def doctor_json(report: DoctorReport) -> DoctorJson:
    """``stepscope doctor --json``: the machine report as measured, plus the two predictions.

    The report's own sections (``cpu``, ``memory``, ``gpu``, ``storage``, ``capabilities``,
    ``training``, ``ceilings``, ``elapsed_s``) pass through; ``schema_version`` is this JSON's.
    """
    out: DoctorJson = {
        "schema": DOCTOR_SCHEMA[0], "schema_version": DOCTOR_SCHEMA[1],
        "cpu": report["cpu"], "memory": report["memory"], "gpu": report["gpu"],
        "storage": report["storage"], "capabilities": report["capabilities"],
        "training": report["training"], "ceilings": report["ceilings"],
        "elapsed_s": report["elapsed_s"],
    }
    if "prediction" in report:
        out["prediction"] = report["prediction"]
    if "cache_prediction" in report:
        out["cache_prediction"] = report["cache_prediction"]
    return out


def tune_json(result: TuneResultDict, config_path: str | None) -> TuneJson:
    """``stepscope tune --json``: every measurement, the winner and where it was written."""
    return {
        "schema": TUNE_SCHEMA[0], "schema_version": TUNE_SCHEMA[1],
        "device": result["device"],
        "budget_s": result["budget_s"],
        "elapsed_s": result["elapsed_s"],
        "winner": result["winner"],
        "reason": result["reason"],
        "config_path": config_path,
        "rows": list(result["rows"]),
        "baseline_workers_curve": dict(result["baseline_workers_curve"]),
        "notes": list(result["notes"]),
    }


def _finite(o: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite figure is a missing one.
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def dumps(obj: ExplainJson | CompareJson | DoctorJson | TuneJson) -> str:
    """Strict JSON text (no NaN), keys in the order built, two-space indent."""
    return json.dumps(_finite(obj), indent=2, default=str, allow_nan=False)
