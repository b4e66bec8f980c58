"""What this machine is, and what stepscope can measure on it: the facts behind ``stepscope doctor``.

Every probe here is cheap (well under a second together), reads the kernel's own files, and
returns plain data. A probe that cannot work says why in words instead of raising: "no" with a
reason is a finding, a traceback is not.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from stepscope import policy
from stepscope.observe import pagecache
from stepscope.observe.base import SamplerUnavailable
from stepscope.observe.blkio import blkio_available
from stepscope.observe.disk import block_device_for
from stepscope.observe.gpu import Nvml
from stepscope.observe.host import cpu_quota_cores, parse_cpuinfo, parse_meminfo, parse_pressure
from stepscope.observe.proctree import parse_io
from stepscope.reports import CapabilityRow

PROC = Path("/proc")
SYS = Path("/sys")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Instruction sets that change how fast a CPU trains or decodes: AVX2 (libjpeg-turbo's and
# OpenCV's SIMD paths), AVX-512 (oneDNN's wide kernels), AVX512-BF16 / AMX (native bf16 math,
# the only case where bf16 autocast beats fp32 on a CPU).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# cgroup v1 reports "no limit" as a huge page-aligned number (2^63 rounded down to a page).
_NO_LIMIT_BYTES = 1 << 60


# --------------------------------------------------------------------------- CPU and memory


@dataclass(frozen=True)
class CpuFacts:
    """The CPU as this process sees it.

    Attributes:
        model_name: /proc/cpuinfo's "model name" (or "unknown").
        logical_cpus: CPUs the kernel lists (``os.cpu_count()``), which a container may not own.
        affinity_cores: CPUs this process may be scheduled on (``os.sched_getaffinity``).
        quota_cores: the cgroup CPU quota in cores, None when there is none.
        usable_cores: what the process can really use: affinity, capped by the quota (at least 1).
        isa: which of :data:`ISA_FLAGS` the CPU has.
        load_avg_1m: the 1-minute load average; above ``usable_cores`` other work competes.
    """

    model_name: str
    logical_cpus: int
    affinity_cores: int
    quota_cores: float | None
    usable_cores: int
    isa: dict[str, bool]
    load_avg_1m: float


def cpu_facts(*, proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> CpuFacts:
    """Read the CPU's name, usable cores and instruction sets.

    Examples:
        >>> cpu_facts().usable_cores >= 1
        True
    """
    name, flags = parse_cpuinfo(_read(proc / "cpuinfo") or "")
    affinity = len(os.sched_getaffinity(0))
    quota = cpu_quota_cores(proc=proc, cgroup_root=cgroup_root)
    usable = policy.job_cores(affinity, quota)  # a quota of 1.5 cores is 1 core to schedule on
    return CpuFacts(
        model_name=name,
        logical_cpus=os.cpu_count() or affinity,
        affinity_cores=affinity,
        quota_cores=quota,
        usable_cores=usable,
        isa={flag: flag in flags for flag in ISA_FLAGS},
        load_avg_1m=os.getloadavg()[0],
    )


@dataclass(frozen=True)
class MemoryFacts:
    """Host memory. ``available_bytes`` (MemAvailable) already counts the page cache the kernel
    could drop, so it is the room a dataset can take in the cache; ``cgroup_limit_bytes`` is a
    memory-cgroup cap (page cache is charged to it too), None when there is none."""

    total_bytes: int
    available_bytes: int
    cached_bytes: int
    cgroup_limit_bytes: int | None


def memory_facts(*, proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> MemoryFacts:
    """Read /proc/meminfo and this process's memory-cgroup limit.

    Examples:
        >>> memory_facts().total_bytes > 0
        True
    """
    info = parse_meminfo(_read(proc / "meminfo") or "")
    return MemoryFacts(
        total_bytes=info.get("MemTotal", 0),
        available_bytes=info.get("MemAvailable", info.get("MemFree", 0)),
        cached_bytes=info.get("Cached", 0),
        cgroup_limit_bytes=memory_cgroup_limit(proc=proc, cgroup_root=cgroup_root),
    )


def memory_cgroup_limit(*, proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> int | None:
    """The tightest memory-cgroup limit over this process's group and its ancestors (v1
    ``memory.limit_in_bytes`` or v2 ``memory.max``), None without one."""
    found: list[int] = []
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            base, name = cgroup_root / "memory", "memory.limit_in_bytes"
        elif parts[1] == "":
            base, name = cgroup_root, "memory.max"
        else:
            continue
        rel = [p for p in parts[2].strip("/").split("/") if p]
        for depth in range(len(rel), -1, -1):
            text = (_read(base.joinpath(*rel[:depth], name)) or "").strip()
            if text.isdigit() and int(text) < _NO_LIMIT_BYTES:
                found.append(int(text))
    return min(found) if found else None


# --------------------------------------------------------------------------- GPU


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML describes it; None where NVML does not say (noted in ``GpuFacts.notes``)."""

    index: int
    name: str
    memory_total_bytes: int | None
    compute_capability: str | None
    pcie_gen: int | None
    pcie_width: int | None
    pcie_max_gen: int | None
    pcie_max_width: int | None


@dataclass
class GpuFacts:
    """What NVML says about the GPUs (``nvml`` False: none, and ``reason`` says why)."""

    nvml: bool
    reason: str
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _text(value: Any) -> str:
    # nvidia-ml-py before 11.5 returned bytes for names and versions
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_facts(module: ModuleType | None = None) -> GpuFacts:
    """Ask NVML for the driver and each device; never raises.

    Args:
        module: a ``pynvml`` stand-in for tests; None imports the real one.

    Examples:
        >>> gpu_facts().nvml in (True, False)
        True
    """
    notes: list[str] = []
    try:
        nvml = Nvml(lambda _source, text: notes.append(text), module)
    except SamplerUnavailable as exc:
        return GpuFacts(nvml=False, reason=str(exc))
    try:
        count = nvml.call("gpu", "nvmlDeviceGetCount") or 0
        driver = nvml.call("gpu", "nvmlSystemGetDriverVersion")
        cuda = nvml.call("gpu", "nvmlSystemGetCudaDriverVersion")  # e.g. 12040 for CUDA 12.4
        facts = GpuFacts(
            nvml=True,
            reason=f"NVML reports {count} GPU(s)" if count else "NVML works but reports no GPU",
            driver_version=None if driver is None else _text(driver),
            cuda_driver_version=None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}",
            notes=notes,
        )
        for index in range(count):
            handle = nvml.call(f"gpu{index}", "nvmlDeviceGetHandleByIndex", index)
            if handle is not None:
                facts.devices.append(_gpu_device(nvml, index, handle))
        return facts
    finally:
        nvml.shutdown()


def _gpu_device(nvml: Nvml, index: int, handle: Any) -> GpuDevice:
    src = f"gpu{index}"

    def call(fn: str) -> Any:
        return nvml.call(src, fn, handle)

    mem = call("nvmlDeviceGetMemoryInfo")
    cc = call("nvmlDeviceGetCudaComputeCapability")
    name = call("nvmlDeviceGetName")
    return GpuDevice(
        index=index,
        name="unknown" if name is None else _text(name),
        memory_total_bytes=None if mem is None else int(mem.total),
        compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
        # The current link can idle down to gen 1 to save power; the max is what a transfer gets.
        pcie_gen=call("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_width=call("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_max_gen=call("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_max_width=call("nvmlDeviceGetMaxPcieLinkWidth"),
    )


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class MountFacts:
    """The filesystem holding a path and the whole disk behind it (None for tmpfs, NFS...)."""

    fstype: str
    mount_point: str
    source: str
    block_device: str | None
    rotational: bool | None


def parse_mountinfo(text: str, path: str) -> tuple[str, str, str] | None:
    """``(fstype, mount point, source)`` of the deepest mount holding absolute ``path``.

    Examples:
        >>> line = "22 1 253:0 / / rw - ext4 /dev/vda rw"
        >>> parse_mountinfo(line, "/work/data")
        ('ext4', '/', '/dev/vda')
    """
    best: tuple[str, str, str] | None = None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= len(best[1])):
            best = (tail[0], mount, tail[1])  # later mounts over the same point win
    return best


def mount_facts(path: Path, *, proc: Path = PROC, sys_root: Path = SYS) -> MountFacts:
    """Filesystem type, mount point and block device holding ``path``.

    Examples:
        >>> mount_facts(Path("/")).mount_point
        '/'
    """
    found = parse_mountinfo(_read(proc / "self" / "mountinfo") or "", str(path.resolve()))
    fstype, mount, source = found if found is not None else ("unknown", "unknown", "unknown")
    device = block_device_for(path, proc=proc, sys=sys_root)
    rotational = None
    if device is not None:
        flag = (_read(sys_root / "block" / device.name / "queue" / "rotational") or "").strip()
        rotational = None if flag not in ("0", "1") else flag == "1"
    return MountFacts(fstype, mount, source, None if device is None else device.name, rotational)


@dataclass(frozen=True)
class ReadSpeed:
    """A cold read of sample files, one at a time, as one DataLoader worker reads them.

    Attributes:
        files: files read.
        bytes: bytes read.
        seconds: time spent reading (open + read + close).
        mb_per_s: decimal megabytes per second.
        files_per_s: files per second (small files are limited by latency, not bandwidth).
        cold_frac: share of the read bytes that were not in the page cache after eviction;
            below 1 the figure is partly a cache read (eviction failed for some files).
    """

    files: int
    bytes: int
    seconds: float
    mb_per_s: float
    files_per_s: float
    cold_frac: float


def read_speed(
    files: Sequence[Path], *, seconds: float = 1.0, max_files: int = 64, seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> ReadSpeed | None:
    """Evict a random sample of ``files`` from the page cache, then read them back cold.

    Nothing is restored afterwards: the evicted pages are only cache, the next epoch reads them
    again. On a virtual disk the host may still cache them, so "cold" means cold for this
    kernel. Returns None when no sample file could be read.

    Examples:
        >>> speed = read_speed(dataset_files, seconds=1.0)  # doctest: +SKIP
        >>> speed.mb_per_s  # doctest: +SKIP
        85.3
    """
    sample = list(files) if len(files) <= max_files else random.Random(seed).sample(list(files), max_files)
    with contextlib.suppress(OSError):
        # fdatasync first: DONTNEED leaves dirty pages (a dataset just written) in the cache.
        pagecache.evict(sample, sync=True)
    done = total = resident = 0
    spent = 0.0
    for path in sample:
        if spent >= seconds:
            break
        try:
            cached, size = pagecache.resident_bytes(path)
            t0 = clock()
            with open(path, "rb", buffering=0) as fh:
                while fh.read(1 << 20):
                    pass
            spent += clock() - t0
        except OSError:
            continue
        done, total, resident = done + 1, total + size, resident + cached
    if done == 0 or spent <= 0:
        return None
    return ReadSpeed(done, total, spent, total / spent / 1e6, done / spent,
                     1.0 - resident / total if total else 0.0)


# --------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class Capability:
    """One thing stepscope may or may not measure here, and why."""

    name: str
    available: bool
    reason: str

    def to_dict(self) -> CapabilityRow:
        return {"name": self.name, "available": self.available, "reason": self.reason}


def check_proc_io(*, proc: Path = PROC) -> Capability:
    """Whether /proc/PID/io is readable for this process and for a child (DataLoader workers)."""
    own = _read(proc / "self" / "io")
    if own is None:
        return Capability("proc_io", False, f"{proc}/self/io is not readable (kernel without "
                          "task I/O accounting): per-process disk reads unavailable")
    child = _spawn_idle_child()
    try:
        text = _read(proc / str(child.pid) / "io")
    finally:
        child.kill()
        child.wait()
    if text is None:
        return Capability("proc_io", False, f"{proc}/self/io works but a child's is not readable "
                          "(ptrace restrictions?): worker reads would be invisible")
    parse_io(text)
    return Capability("proc_io", True, "readable for this process and for a child process")


def _spawn_idle_child() -> subprocess.Popen[bytes]:
    # The smallest child there is: `sleep`, or a Python that waits on stdin where there is none.
    sleep = shutil.which("sleep")
    cmd = [sleep, "30"] if sleep else [sys.executable, "-c", "import sys; sys.stdin.read()"]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def check_residency(probe_file: Path) -> Capability:
    """Whether page-cache residency can be asked (cachestat, else mmap + mincore)."""
    try:
        resident, size = pagecache.resident_bytes(probe_file)
    except OSError as exc:
        return Capability("pagecache_residency", False, f"mincore on {probe_file} failed: {exc}")
    how = "cachestat syscall" if pagecache.HAVE_CACHESTAT else "mmap + mincore"
    return Capability("pagecache_residency", True, f"{how} works ({resident} of {size} bytes "
                      f"of {probe_file.name} resident)")


def check_pressure(*, proc: Path = PROC) -> Capability:
    """Whether /proc/pressure/{cpu,io,memory} (PSI stall times) can be read."""
    missing = []
    for resource in ("cpu", "io", "memory"):
        text = _read(proc / "pressure" / resource)
        if text is None or "some" not in parse_pressure(text):
            missing.append(resource)
    if missing:
        return Capability("pressure", False, f"{proc}/pressure/{{{','.join(missing)}}} not readable "
                          "(kernel without CONFIG_PSI, or booted with psi=0)")
    return Capability("pressure", True, "/proc/pressure/cpu, io and memory are readable")


def check_eviction(probe_file: Path | None = None) -> Capability:
    """Whether ``posix_fadvise(DONTNEED)`` really drops a file's pages here.

    Reads ``probe_file`` (a dataset file, on the dataset's filesystem) or a fresh temporary
    file into the cache, evicts it and asks residency again. tmpfs and overlay-on-tmpfs keep
    files in memory whatever one advises: there a cold-cache run is impossible.
    """
    tmp: Path | None = None
    try:
        if probe_file is None:
            fd, name = tempfile.mkstemp(prefix="stepscope-evict-")
            tmp = Path(name)
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(256 * 1024))
                fh.flush()
                os.fsync(fh.fileno())
        target = probe_file or tmp
        assert target is not None
        target.read_bytes()
        before, size = pagecache.resident_bytes(target)
        pagecache.evict([target], sync=True)
        after, _ = pagecache.resident_bytes(target)
    except OSError as exc:
        return Capability("eviction", False, f"posix_fadvise(DONTNEED) failed: {exc}")
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    where = f"{target.name} ({size} bytes)"
    if before == 0:
        return Capability("eviction", False, f"{where} was not cached even after reading it: "
                          "cannot tell whether eviction works")
    if after * 10 > before:  # a page or two may be pinned by someone else's mapping
        return Capability("eviction", False, f"posix_fadvise(DONTNEED) left {after} of {before} "
                          f"cached bytes of {where} (tmpfs or similar): cold-cache runs impossible")
    return Capability("eviction", True, f"posix_fadvise(DONTNEED) dropped {where} from the cache")


def check_blkio() -> Capability:
    """Whether a cgroup-v1 blkio throttle can be set (an induced storage bottleneck)."""
    ok, why = blkio_available()
    return Capability("blkio_throttle", ok, why)


def check_nvml(gpu: GpuFacts) -> Capability:
    """NVML's availability, from :func:`gpu_facts`."""
    return Capability("nvml", gpu.nvml, gpu.reason)


def capabilities(gpu: GpuFacts, probe_file: Path | None = None) -> list[Capability]:
    """Every measurement capability, each yes/no with the reason.

    Args:
        gpu: the result of :func:`gpu_facts` (NVML is not started twice).
        probe_file: a dataset file for the residency and eviction checks (they then speak
            of the dataset's own filesystem); None uses a temporary file.

    Examples:
        >>> [c.name for c in capabilities(gpu_facts())][:2]
        ['nvml', 'proc_io']
    """
    checks: list[Callable[[], Capability]] = [
        lambda: check_nvml(gpu),
        check_proc_io,
        lambda: check_residency(probe_file or Path(sys.executable)),
        check_pressure,
        lambda: check_eviction(probe_file),
        check_blkio,
    ]
    return [check() for check in checks]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
