"""Typed contracts for what crosses layers in ``summary.json``: findings and memory-ledger items.

They are ``TypedDict``s, so a summary is still the plain JSON-ready dict DESIGN.md specifies
(``summary.json`` is unchanged, schema_version 1) while mypy checks every key the analysis
writes and the renderers read. Build them with the constructors here (tests included), not by
hand, so fixtures cannot drift from what the analysis emits.

Examples:
    >>> f = make_finding("input_bound_train", "high", "Training waits for data",
    ...                  ["62 % of step time blocked in the loader"], "raise workers 0 → 2",
    ...                  "~2.4× faster")
    >>> f["severity"], f["evidence"]
    ('high', '62 % of step time blocked in the loader')
    >>> ledger_item("weights", 14_000_000.0, "parameters + buffers")["bytes"]
    14000000
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

Severity = Literal["high", "medium", "low", "info"]
SEVERITIES: tuple[Severity, ...] = ("high", "medium", "low", "info")  # most severe first


class Finding(TypedDict):
    """One entry of ``summary["findings"]``: what holds the run back and what to do."""

    id: str
    severity: Severity
    title: str
    evidence: str  # the measurements it rests on, "; "-joined
    fix: str
    expected_gain: str | None
    measure: str | None  # how to confirm the gain


class LedgerItem(TypedDict):
    """One entry of ``summary["memory"]["ledger"]``."""

    item: str
    bytes: int
    how_measured: str


def make_finding(fid: str, severity: Severity, title: str, evidence: Sequence[str], fix: str,
                 expected_gain: str | None, measure: str | None = None) -> Finding:
    """A finding; ``evidence`` lines are joined with "; " as ``summary.json`` keeps them."""
    return {"id": fid, "severity": severity, "title": title, "evidence": "; ".join(evidence),
            "fix": fix, "expected_gain": expected_gain, "measure": measure}


def ledger_item(item: str, n: float, how_measured: str) -> LedgerItem:
    """A memory-ledger item of ``n`` bytes (whole bytes) and how they were measured."""
    return {"item": item, "bytes": int(n), "how_measured": how_measured}


def by_severity(findings: Sequence[Finding]) -> list[Finding]:
    """Most severe first, keeping the analysis's order within one severity."""
    return sorted(findings, key=lambda f: SEVERITIES.index(f["severity"]))


__all__ = ["SEVERITIES", "Finding", "LedgerItem", "Severity", "by_severity", "ledger_item",
           "make_finding"]
