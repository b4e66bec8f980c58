"""observe.machine: CPU, memory, GPU, storage facts and the measurement-capability checks."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest

from stepscope.observe import machine, pagecache
from stepscope.observe.machine import (
    Capability,
    check_eviction,
    check_pressure,
    check_proc_io,
    parse_cpuinfo,
    parse_mountinfo,
)


def _cpuinfo_flags() -> frozenset[str]:
    return parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]


def test_cpu_facts_match_this_process() -> None:
    cpu = machine.cpu_facts()
    assert cpu.affinity_cores == len(os.sched_getaffinity(0))
    assert 1 <= cpu.usable_cores <= cpu.affinity_cores
    flags = _cpuinfo_flags()
    assert cpu.isa == {flag: flag in flags for flag in machine.ISA_FLAGS}
    assert cpu.model_name != ""


def test_cpu_quota_caps_usable_cores(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("1:cpu:/job\n")
    (proc / "cpuinfo").write_text("model name\t: Test CPU\nflags\t\t: avx2\n")
    (cg / "cpu" / "job").mkdir(parents=True)
    (cg / "cpu" / "job" / "cpu.cfs_quota_us").write_text("150000\n")
    (cg / "cpu" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    cpu = machine.cpu_facts(proc=proc, cgroup_root=cg)
    assert cpu.quota_cores == 1.5
    assert cpu.usable_cores == 1  # 1.5 cores of quota: one thread never throttled
    assert cpu.isa["avx2"] and not cpu.isa["avx512_bf16"]
    assert cpu.model_name == "Test CPU"


def test_parse_cpuinfo_arm_features() -> None:
    name, flags = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert name == "unknown"
    assert flags == {"fp", "asimd", "bf16"}


def test_memory_facts() -> None:
    mem = machine.memory_facts()
    assert 0 < mem.available_bytes <= mem.total_bytes


def test_memory_cgroup_limit_v1_and_v2(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:memory:/a/b\n0::/c\n")
    (cg / "memory" / "a" / "b").mkdir(parents=True)
    (cg / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (cg / "memory" / "a" / "memory.limit_in_bytes").write_text("8000000000\n")
    (cg / "c").mkdir(parents=True)
    (cg / "c" / "memory.max").write_text("max\n")
    assert machine.memory_cgroup_limit(proc=proc, cgroup_root=cg) == 8_000_000_000
    (cg / "c" / "memory.max").write_text("4000000000\n")
    assert machine.memory_cgroup_limit(proc=proc, cgroup_root=cg) == 4_000_000_000


def test_gpu_facts_without_nvml_gives_reason() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works on this machine; the no-GPU path is not reachable")
    except Exception:
        pass
    gpu = machine.gpu_facts()
    assert gpu.nvml is False
    assert gpu.devices == []
    assert gpu.reason.startswith("NVML not available")


class _NvmlError(Exception):
    pass


class _NotSupported(_NvmlError):
    pass


def _fake_pynvml() -> Any:
    """A stand-in for pynvml: there is no GPU here (the real path runs in scripts/device-check)."""

    def not_supported(*_: Any) -> Any:
        raise _NotSupported("Not Supported")

    return types.SimpleNamespace(
        NVMLError=_NvmlError, NVMLError_NotSupported=_NotSupported,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=141 * 10**9, used=0),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetMaxPcieLinkWidth=not_supported,
    )


def test_gpu_facts_reads_every_device_field() -> None:
    gpu = machine.gpu_facts(_fake_pynvml())
    assert gpu.nvml and gpu.driver_version == "550.54.15" and gpu.cuda_driver_version == "12.4"
    (dev,) = gpu.devices
    assert (dev.name, dev.memory_total_bytes, dev.compute_capability) == (
        "NVIDIA H200", 141 * 10**9, "9.0")
    assert (dev.pcie_gen, dev.pcie_width, dev.pcie_max_gen) == (5, 16, 5)
    assert dev.pcie_max_width is None  # not supported: absent, with one note
    assert any("nvmlDeviceGetMaxPcieLinkWidth" in n for n in gpu.notes)


def test_parse_mountinfo_picks_deepest_mount() -> None:
    text = ("22 1 253:0 / / rw,relatime - ext4 /dev/vda rw\n"
            "30 22 0:40 / /work/data rw - tmpfs tmpfs rw\n"
            "31 22 0:41 / /work/my\\040disk rw - xfs /dev/vdb rw\n")
    assert parse_mountinfo(text, "/work/data/x.jpg") == ("tmpfs", "/work/data", "tmpfs")
    assert parse_mountinfo(text, "/work/database") == ("ext4", "/", "/dev/vda")
    assert parse_mountinfo(text, "/work/my disk/a") == ("xfs", "/work/my disk", "/dev/vdb")


def test_mount_facts_for_a_real_path(tmp_path: Path) -> None:
    facts = machine.mount_facts(tmp_path)
    assert facts.fstype not in ("", "unknown")
    assert str(tmp_path.resolve()).startswith(facts.mount_point.rstrip("/") + "/")


def test_read_speed_reads_the_sample_cold(tmp_path: Path) -> None:
    files = []
    for i in range(6):
        f = tmp_path / f"f{i}.bin"
        f.write_bytes(os.urandom(100_000))
        files.append(f)
    speed = machine.read_speed(files, seconds=5.0)
    assert speed is not None
    assert speed.files == 6 and speed.bytes == 600_000
    assert speed.mb_per_s > 0 and speed.files_per_s > 0
    if check_eviction(files[0]).available:
        assert speed.cold_frac > 0.9


def test_read_speed_stops_at_budget(tmp_path: Path) -> None:
    files = [tmp_path / f"f{i}" for i in range(5)]
    for f in files:
        f.write_bytes(b"x" * 1000)
    ticks = iter(range(100))
    speed = machine.read_speed(files, seconds=2.0, clock=lambda: float(next(ticks)))
    assert speed is not None and speed.files == 2  # each read "takes" 1 s on this clock


def test_capabilities_are_bools_with_reasons() -> None:
    gpu = machine.gpu_facts()
    caps = machine.capabilities(gpu)
    assert [c.name for c in caps] == ["nvml", "proc_io", "pagecache_residency", "pressure",
                                      "eviction", "blkio_throttle"]
    for c in caps:
        assert isinstance(c, Capability) and isinstance(c.available, bool) and c.reason
    by_name = {c.name: c for c in caps}
    assert by_name["nvml"].available == gpu.nvml
    assert by_name["proc_io"].available == Path("/proc/self/io").exists()
    assert by_name["pressure"].available == Path("/proc/pressure/io").exists()


def test_proc_io_missing(tmp_path: Path) -> None:
    cap = check_proc_io(proc=tmp_path)
    assert not cap.available and "io" in cap.reason


def test_pressure_missing(tmp_path: Path) -> None:
    cap = check_pressure(proc=tmp_path)
    assert not cap.available and "CONFIG_PSI" in cap.reason


def test_eviction_on_tmpfs_is_impossible() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or machine.mount_facts(shm).fstype != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    probe = shm / f"stepscope-test-{os.getpid()}"
    probe.write_bytes(os.urandom(64 * 1024))
    try:
        cap = check_eviction(probe)
    finally:
        probe.unlink()
    assert not cap.available and "tmpfs" in cap.reason


def test_eviction_on_a_disk_file(tmp_path: Path) -> None:
    if machine.mount_facts(tmp_path).block_device is None:
        pytest.skip(f"{tmp_path} is on no block device")
    probe = tmp_path / "probe.bin"
    probe.write_bytes(os.urandom(128 * 1024))
    cap = check_eviction(probe)
    assert cap.available, cap.reason
    assert pagecache.resident_bytes(probe)[0] == 0
