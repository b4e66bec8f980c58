"""The typed contracts that mirror a dataclass keep its fields, one for one.

``reports.py`` and ``analysis/contracts_summary.py`` describe some sections as the dict of a
dataclass (``dataclasses.asdict`` / ``vars``); a field added to the dataclass but not to its
contract would reach the JSON untyped, and one removed would leave a key mypy still trusts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from stepscope import reports
from stepscope.analysis import contracts_summary as cs
from stepscope.analysis import rankscale
from stepscope.analysis.capacity import Capacity
from stepscope.analysis.contracts import Finding
from stepscope.analysis.summary import write_summary
from stepscope.observe import machine
from stepscope.store.rundir import RunDir
from stepscope.train.ceilings import Ceiling
from stepscope.train.tune import TuneResult, TuneRow
from tests.analysis_runs import CPU_FACTS, PhaseSpec, RunSpec, make_run
from tests.contract_check import assert_conforms, conforms
from tests.test_analysis_arrivals import N as ARRIVAL_N
from tests.test_analysis_arrivals import _job as arrival_job
from tests.test_analysis_arrivals import _store as arrival_store
from tests.test_ranks import RankSpec, make_job

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("contract", "cls", "extra"), [
    (reports.CpuReport, machine.CpuFacts, {"bf16_native"}),
    (reports.MemoryReport, machine.MemoryFacts, set()),
    (reports.GpuDeviceRow, machine.GpuDevice, set()),
    (reports.GpuReport, machine.GpuFacts,
     {"torch_cuda_available", "torch_device_count", "torch_cuda_version"}),
    (reports.ReadSpeedRow, machine.ReadSpeed, set()),
    (reports.CapabilityRow, machine.Capability, set()),
    (reports.CeilingRow, Ceiling, set()),
    (reports.TuneRowDict, TuneRow, set()),
    (reports.TuneResultDict, TuneResult, set()),
    (cs.CapacityRow, Capacity, set()),
])
def test_contract_mirrors_its_dataclass(contract: Any, cls: type, extra: set[str]) -> None:
    assert contract.__required_keys__ | contract.__optional_keys__ == _fields(cls) | extra


def test_storage_report_carries_the_mount_facts() -> None:
    keys = reports.StorageReport.__required_keys__
    assert _fields(machine.MountFacts) <= keys


# --- what the code emits conforms to its contract (checked at run time on real stores) -------

def _summary_json(run_dir: Path) -> dict[str, Any]:
    write_summary(run_dir)
    return json.loads(RunDir(run_dir).summary.read_text())  # as compare and report read it


@pytest.mark.parametrize("spec", [
    RunSpec([PhaseSpec(1, data_wait_s=0.3), PhaseSpec(1, "val"), PhaseSpec(2, checkpoint_s=0.4)],
            facts=dict(CPU_FACTS)),
    RunSpec([PhaseSpec(1, gpu_util_pct=40.0), PhaseSpec(1, "val", gpu_util_pct=20.0)],
            facts=dict(CPU_FACTS), device="cuda:0"),
], ids=["cpu", "gpu"])
def test_summary_json_conforms_to_the_summary_contract(tmp_path: Path, spec: RunSpec) -> None:
    s = _summary_json(make_run(tmp_path / "run", spec))
    assert s["phases"] and s["by_phase"]  # something to check
    assert_conforms(s, cs.Summary)


def test_rank_merges_conform_per_step_with_arrivals_and_from_rollups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_job(tmp_path / "ddp", [RankSpec(), RankSpec(data_wait_s=0.045, workers=0)])
    s = _summary_json(tmp_path / "ddp")
    assert s["ranks"] and s["distributed"]["stragglers"] == [1]
    assert_conforms(s, cs.Summary)

    job = arrival_job([[0.0] * ARRIVAL_N, [0.030] * ARRIVAL_N])
    for r in job:
        arrival_store(tmp_path / "watched", r.rank, r.arrivals, compute_s=0.045)
    s = _summary_json(tmp_path / "watched")
    assert s["ranks"][1]["arrival_straggler"] is True
    assert_conforms(s, cs.Summary)

    monkeypatch.setattr(rankscale, "ROLLUP_ABOVE_RANKS", 1)  # the big-job merge, on two ranks
    s = _summary_json(tmp_path / "watched")
    assert s["distributed"]["mode"] == "rollup"
    assert_conforms(s, cs.Summary)


def test_the_checker_catches_drift() -> None:
    # The drift issue 16 found in hand-made fixtures: a severity that does not exist, evidence
    # as a list (summary.json keeps one "; "-joined string).
    bad = {"id": "x", "severity": "critical", "title": "t", "evidence": ["a", "b"], "fix": "f",
           "expected_gain": None, "measure": None}
    found = conforms(bad, Finding)
    assert any("severity" in m for m in found) and any("evidence" in m for m in found)
    assert conforms({"phase": "train", "steps": "40"}, cs.PhaseRow, partial=True) == [
        ".steps: '40', not an int"]
    assert conforms({"made_up": 1}, cs.PhaseRow, partial=True) == [
        ".made_up: not a key of PhaseRow"]
