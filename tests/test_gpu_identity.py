"""cuda:N -> NVML index by UUID, PCI bus id, CUDA_VISIBLE_DEVICES; fakes, as there is no GPU."""

from __future__ import annotations

import pytest

from stepscope.analysis.gpu_identity import normalize_pci, resolve_nvml_index

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


NVML = {"gpu0.uuid": "GPU-aaaa1111-0000-0000-0000-000000000000",
        "gpu1.uuid": "GPU-bbbb2222-0000-0000-0000-000000000000",
        "gpu0.pci_bus_id": "00000000:3B:00.0", "gpu1.pci_bus_id": "00000000:AF:00.0"}


def test_uuid_decides_under_a_device_mask() -> None:
    # CUDA_VISIBLE_DEVICES=1: torch's cuda:0 is NVML's gpu1.
    facts = {**NVML, "env.cuda_visible_devices": "1",
             "torch.cuda0.uuid": "bbbb2222-0000-0000-0000-000000000000"}
    assert resolve_nvml_index(0, facts) == (1, "UUID")


def test_pci_bus_id_when_no_uuid() -> None:
    facts = {**NVML, "torch.cuda0.pci_bus_id": "0000:af:00.0"}
    assert resolve_nvml_index(0, facts) == (1, "PCI bus id")


def test_visible_devices_fallback_by_index_and_by_uuid() -> None:
    assert resolve_nvml_index(0, {**NVML, "env.cuda_visible_devices": "1,0"})[0] == 1
    assert resolve_nvml_index(1, {**NVML, "env.cuda_visible_devices": "1,0"})[0] == 0
    by_uuid = {**NVML, "env.cuda_visible_devices": "GPU-bbbb2222"}
    assert resolve_nvml_index(0, by_uuid) == (1, "CUDA_VISIBLE_DEVICES UUID")


def test_no_identity_is_said_to_be_assumed() -> None:
    index, how = resolve_nvml_index(2, {})
    assert index == 2 and how.startswith("assumed")


def test_pci_forms() -> None:
    assert normalize_pci("00000000:3B:00.0") == normalize_pci("0000:3b:00.0") == (0, 0x3B, 0)
    assert normalize_pci("nonsense") is None
