"""Which NVML device a run's ``cuda:N`` is.

``cuda:N`` counts the devices CUDA makes visible, in CUDA's order: ``CUDA_VISIBLE_DEVICES``
masks and reorders them, and without ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` CUDA puts the fastest
first. NVML's index is the PCI order of every device on the machine. So ``cuda:N`` is NVML's
``gpuN`` only by luck; the facts decide, most certain first:

1. the device's UUID as torch reports it (``torch.cuda<N>.uuid``) equal to NVML's
   (``gpu<M>.uuid``);
2. its PCI bus id (``torch.cuda<N>.pci_bus_id`` against ``gpu<M>.pci_bus_id``);
3. ``CUDA_VISIBLE_DEVICES`` (``env.cuda_visible_devices``): its N-th entry, an NVML index or a
   UUID (prefix), assuming PCI order (said so in ``how``);
4. otherwise N itself, said so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def normalize_uuid(value: object) -> str:
    """``GPU-8e6c1d2a-...`` and torch's ``8e6c1d2a-...`` compare equal."""
    text = str(value).strip().lower()
    text = text.removeprefix("gpu-").removeprefix("mig-")
    return text.replace("-", "")


def normalize_pci(value: object) -> tuple[int, int, int] | None:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` -> (domain, bus, device)."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.\d+)?", str(value).strip())
    if not m:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


def _nvml_ids(facts: Mapping[str, Any], kind: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for key, value in facts.items():
        m = re.fullmatch(rf"gpu(\d+)\.{kind}", key)
        if m and value is not None:
            out[int(m.group(1))] = value
    return out


def resolve_nvml_index(cuda_index: int, facts: Mapping[str, Any]) -> tuple[int, str]:
    """(NVML index, how it was decided) for ``cuda:<cuda_index>``; ``facts`` maps key -> value.

    Examples:
        >>> resolve_nvml_index(0, {"torch.cuda0.uuid": "ab-12", "gpu1.uuid": "GPU-ab-12"})
        (1, 'UUID')
    """
    uuid = facts.get(f"torch.cuda{cuda_index}.uuid")
    if uuid is not None:
        for index, nv in _nvml_ids(facts, "uuid").items():
            if normalize_uuid(nv) == normalize_uuid(uuid):
                return index, "UUID"
    pci = normalize_pci(facts.get(f"torch.cuda{cuda_index}.pci_bus_id") or "")
    if pci is not None:
        for index, nv in _nvml_ids(facts, "pci_bus_id").items():
            if normalize_pci(nv) == pci:
                return index, "PCI bus id"
    visible = facts.get("env.cuda_visible_devices")
    if visible:
        entries = [e.strip() for e in str(visible).split(",") if e.strip()]
        if cuda_index < len(entries):
            entry = entries[cuda_index]
            if entry.isdigit():
                return int(entry), "CUDA_VISIBLE_DEVICES, assuming PCI order"
            for index, nv in _nvml_ids(facts, "uuid").items():
                if normalize_uuid(nv).startswith(normalize_uuid(entry)):
                    return index, "CUDA_VISIBLE_DEVICES UUID"
    return cuda_index, "assumed: cuda:N is NVML's gpuN (no UUID or PCI id recorded)"
