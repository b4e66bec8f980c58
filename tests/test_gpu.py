"""GPU sampler. There is no GPU here: the real "absent" path is tested as is, and the NVML path
against a stand-in ``pynvml`` module (the only fake in the suite; scripts/device-check runs the
real one on a GPU machine)."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from stepscope.observe.base import SamplerUnavailable
from stepscope.observe.gpu import GpuSampler, Nvml, torch_allocator_samples

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


def test_without_a_gpu_nvml_is_unavailable_with_the_reason() -> None:
    notes: list[tuple[str, str]] = []
    try:
        sampler = GpuSampler(note=lambda s, t: notes.append((s, t)))
    except SamplerUnavailable as exc:
        assert str(exc).startswith("NVML not available: ")
        return
    sampler.close()  # a machine with a GPU: nothing to check here
    pytest.skip("this machine has NVML and a GPU")


def _fake_pynvml(pcie_supported: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):  # pynvml's own class name
        pass

    def not_supported(*_: Any) -> None:
        raise NVMLError_NotSupported("Not Supported")

    calls: dict[str, int] = {}

    def counted(name: str, value: Any) -> Any:
        def fn(*_: Any) -> Any:
            calls[name] = calls.get(name, 0) + 1
            return value
        return fn

    nv.__dict__.update(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported,
        NVML_PCIE_UTIL_TX_BYTES=0, NVML_PCIE_UTIL_RX_BYTES=1, NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1, calls=calls,
        nvmlInit=counted("init", None), nvmlShutdown=counted("shutdown", None),
        nvmlDeviceGetCount=counted("count", 1),
        nvmlDeviceGetHandleByIndex=counted("handle", "h0"),
        nvmlDeviceGetUtilizationRates=counted("util", SimpleNamespace(gpu=30, memory=12)),
        nvmlDeviceGetMemoryInfo=counted("mem", SimpleNamespace(used=6_500 << 20, total=16 << 30)),
        nvmlDeviceGetPcieThroughput=counted("pcie", 2000) if pcie_supported else not_supported,
        nvmlDeviceGetPowerUsage=counted("power", 150_000),
        nvmlDeviceGetTemperature=counted("temp", 61),
        nvmlDeviceGetClockInfo=counted("clock", 1410),
        nvmlDeviceGetComputeRunningProcesses=counted("procs", [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=900 << 20),
            SimpleNamespace(pid=1, usedGpuMemory=100 << 20),  # someone else's
            SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=None),
        ]),
    )
    return nv


def _sampler(nv: types.ModuleType, notes: list[tuple[str, str]], pids: set[int]) -> GpuSampler:
    def note(source: str, text: str) -> None:
        notes.append((source, text))

    return GpuSampler(pids=lambda: pids, note=note, nvml=Nvml(note, module=nv))


def test_device_metrics_units_and_one_note_for_unsupported() -> None:
    nv, notes = _fake_pynvml(pcie_supported=False), []
    sampler = _sampler(nv, notes, {os.getpid(), os.getpid() + 1})
    first = {(s.source, s.metric): s.value for s in sampler.sample(7.0)}
    sampler.sample(8.0)
    assert first[("gpu0", "util_pct")] == 30 and first[("gpu0", "mem_util_pct")] == 12
    assert first[("gpu0", "mem_used_bytes")] == 6_500 << 20
    assert first[("gpu0", "mem_total_bytes")] == 16 << 30
    assert first[("gpu0", "power_w")] == 150.0
    assert first[("gpu0", "temp_c")] == 61 and first[("gpu0", "sm_clock_mhz")] == 1410
    assert ("gpu0", "pcie_rx_bytes_per_s") not in first
    assert notes == [("gpu0", "nvmlDeviceGetPcieThroughput: not supported on this device; "
                              "its series is absent")]
    # per-process memory only for our tree's PIDs, and only where NVML reports it
    assert first[(f"gpu0:proc:{os.getpid()}", "mem_used_bytes")] == 900 << 20
    assert not [k for k in first if k[0] in ("gpu0:proc:1", f"gpu0:proc:{os.getpid() + 1}")]
    assert nv.calls["init"] == 1


def test_pcie_kilobytes_become_bytes() -> None:
    sampler = _sampler(_fake_pynvml(pcie_supported=True), [], set())
    got = {s.metric: s.value for s in sampler.sample(0.0) if s.source == "gpu0"}
    assert got["pcie_rx_bytes_per_s"] == got["pcie_tx_bytes_per_s"] == 2000 * 1024


def test_foreign_pids_only_give_one_note() -> None:
    notes: list[tuple[str, str]] = []
    sampler = _sampler(_fake_pynvml(pcie_supported=True), notes, {424242})
    sampler.sample(0.0)
    sampler.sample(1.0)
    assert len(notes) == 1 and "none of the observed PIDs" in notes[0][1]


def test_nvml_init_failure_is_unavailable() -> None:
    nv = _fake_pynvml()

    def fail() -> None:
        raise nv.NVMLError("Driver Not Loaded")

    nv.nvmlInit = fail
    with pytest.raises(SamplerUnavailable, match="NVML not available: Driver Not Loaded"):
        Nvml(lambda s, t: None, module=nv)


def test_no_devices_is_unavailable() -> None:
    nv = _fake_pynvml()
    nv.nvmlDeviceGetCount = lambda: 0
    with pytest.raises(SamplerUnavailable, match="no GPU"):
        _sampler(nv, [], set())


def test_torch_allocator_never_initialises_cuda() -> None:
    torch = pytest.importorskip("torch")
    assert "torch" in sys.modules
    was = torch.cuda.is_initialized()
    samples = torch_allocator_samples(0.0)
    assert torch.cuda.is_initialized() == was
    if not was:
        assert samples == []


def test_identities_name_each_nvml_device() -> None:
    nv, notes = _fake_pynvml(), []
    nv.__dict__.update(nvmlDeviceGetUUID=lambda h: b"GPU-aaaa1111",
                       nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:3B:00.0"))
    ids = _sampler(nv, notes, set()).identities()
    assert ids["gpu0.uuid"][0] == "GPU-aaaa1111"
    assert ids["gpu0.pci_bus_id"][0] == "00000000:3B:00.0"


def test_torch_identity_facts_match_nvml_forms() -> None:
    from stepscope.analysis.gpu_identity import resolve_nvml_index
    from stepscope.observe.gpu import torch_device_identity

    props = SimpleNamespace(uuid="aaaa1111", pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: props))
    facts = {k: v for k, (v, _) in torch_device_identity(fake_torch, 0).items()}
    facts.update({"gpu0.uuid": "GPU-ffff", "gpu1.uuid": "GPU-aaaa1111"})
    assert resolve_nvml_index(0, facts) == (1, "UUID")
    del facts["torch.cuda0.uuid"]
    facts["gpu1.pci_bus_id"] = "00000000:3B:00.0"
    assert resolve_nvml_index(0, facts) == (1, "PCI bus id")


def test_cuda_context_is_nvml_after_init_minus_before() -> None:
    from stepscope.observe.gpu import measure_cuda_context

    nv, notes = _fake_pynvml(), []
    me = os.getpid()
    listed: list[SimpleNamespace] = []  # the process is not on the GPU before CUDA starts
    nv.__dict__["nvmlDeviceGetComputeRunningProcesses"] = lambda h: list(listed)

    def init() -> None:
        listed.append(SimpleNamespace(pid=me, usedGpuMemory=500 << 20))

    nvml = Nvml(lambda s, t: notes.append((s, t)), module=nv)
    assert measure_cuda_context(init, lambda: 2 << 20, nvml, me) == (500 << 20) - (2 << 20)
