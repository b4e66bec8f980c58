"""The typed contracts that mirror a dataclass keep its fields, one for one.

``reports.py`` and ``analysis/contracts_summary.py`` describe some sections as the dict of a
dataclass (``dataclasses.asdict`` / ``vars``); a field added to the dataclass but not to its
contract would reach the JSON untyped, and one removed would leave a key mypy still trusts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stepscope import reports
from stepscope.analysis import contracts_summary as cs
from stepscope.analysis.capacity import Capacity
from stepscope.observe import machine
from stepscope.train.ceilings import Ceiling
from stepscope.train.tune import TuneResult, TuneRow

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
