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
from typing import Any

from stepscope.analysis.compare import Comparison
from stepscope.analysis.contracts_summary import Summary
from stepscope.reports import DoctorReport, TuneResultDict

EXPLAIN_SCHEMA = ("stepscope.explain", 1)
COMPARE_SCHEMA = ("stepscope.compare", 1)
DOCTOR_SCHEMA = ("stepscope.doctor", 1)
TUNE_SCHEMA = ("stepscope.tune", 1)


def _head(schema: tuple[str, int]) -> dict[str, Any]:
    return {"schema": schema[0], "schema_version": schema[1]}


def _run_ref(summary: Summary) -> dict[str, Any]:
    run = summary.get("run") or {}
    return {k: run.get(k) for k in ("name", "status", "device", "kind", "started", "ended")}


def explain_json(summary: Summary, answers: Sequence[Any]) -> dict[str, Any]:
    """``stepscope explain --json``: the run and its numbered answers."""
    return {
        **_head(EXPLAIN_SCHEMA),
        "run": _run_ref(summary),
        "answers": [{"number": int(a.number), "title": str(a.title), "text": str(a.text)}
                    for a in answers],
    }


def compare_json(cmp: Comparison, a: Summary, b: Summary) -> dict[str, Any]:
    """``stepscope compare --json``: run b against run a, phase by phase."""
    return {
        **_head(COMPARE_SCHEMA),
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


def doctor_json(report: DoctorReport) -> dict[str, Any]:
    """``stepscope doctor --json``: the machine report as measured, plus the two predictions.

    The report's own sections (``cpu``, ``memory``, ``gpu``, ``storage``, ``capabilities``,
    ``training``, ``ceilings``, ``elapsed_s``) pass through; ``schema_version`` is this JSON's.
    """
    body = {k: v for k, v in report.items() if k != "schema_version"}
    return {**_head(DOCTOR_SCHEMA), **body}


def tune_json(result: TuneResultDict, config_path: str | None) -> dict[str, Any]:
    """``stepscope tune --json``: every measurement, the winner and where it was written."""
    return {
        **_head(TUNE_SCHEMA),
        "device": result.get("device"),
        "budget_s": result.get("budget_s"),
        "elapsed_s": result.get("elapsed_s"),
        "winner": result.get("winner") or {},
        "reason": result.get("reason"),
        "config_path": config_path,
        "rows": list(result.get("rows") or []),
        "baseline_workers_curve": dict(result.get("baseline_workers_curve") or {}),
        "notes": list(result.get("notes") or []),
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


def dumps(obj: dict[str, Any]) -> str:
    """Strict JSON text (no NaN), keys in the order built, two-space indent."""
    return json.dumps(_finite(obj), indent=2, default=str, allow_nan=False)
