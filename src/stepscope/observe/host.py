"""Host-wide samples: CPU per core, system memory, pressure stall information, CPU quota.

Everything comes from /proc text files, read directly: one ``read()`` per file per sample is
cheaper than psutil's object layer, and each number can be traced to one kernel counter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stepscope.observe.base import SamplerUnavailable
from stepscope.policy import cpu_has_native_bf16
from stepscope.store.records import Sample

PROC = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")

# /proc/meminfo key -> our metric. "Used" is derived (total - available), see HostSampler.
_MEMINFO_KEYS = {
    "MemTotal": "mem_total_bytes",
    "MemAvailable": "mem_available_bytes",
    "Cached": "mem_cached_bytes",
    "Shmem": "mem_shmem_bytes",
}
# (pressure file, line) -> metric. "some" = at least one task stalled, "full" = all stalled.
_PSI_METRICS = {
    ("cpu", "some"): "psi_cpu_some_pct",
    ("io", "some"): "psi_io_some_pct",
    ("io", "full"): "psi_io_full_pct",
    ("memory", "some"): "psi_mem_some_pct",
}


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative jiffies of one CPU line of /proc/stat."""

    busy: int
    total: int
    steal: int = 0


def parse_proc_stat(text: str) -> dict[str, CpuTimes]:
    """Parse the ``cpu``/``cpuN`` lines of /proc/stat into busy and total jiffies.

    Idle and iowait count as not busy: a core waiting for the disk is free to run other work.
    ``guest`` time is already inside ``user`` so it is not added again. Steal (the hypervisor
    running other guests on this VM's cores) is busy: no process here could have had it.

    Examples:
        >>> parse_proc_stat("cpu0 10 0 5 80 5 0 0 3 0 0\\n")["cpu0"]
        CpuTimes(busy=18, total=103, steal=3)
    """
    out: dict[str, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        total = sum(ticks)
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        steal = ticks[7] if len(ticks) > 7 else 0
        out[name] = CpuTimes(busy=total - idle, total=total, steal=steal)
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo into bytes per key (the file says kB, meaning KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def parse_pressure(text: str) -> dict[str, int]:
    """Parse a /proc/pressure/* file into ``{"some": total_us, "full": total_us}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        for field in fields:
            if field.startswith("total="):
                out[kind] = int(field[len("total="):])
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class HostSampler:
    """Samples ``host`` and ``cpu<N>`` series (see docs/records.md).

    CPU utilization and pressure are deltas of cumulative counters, so the constructor takes a
    baseline: the first ``sample`` already reports the interval since construction.

    Examples:
        >>> s = HostSampler()
        >>> [x.metric for x in s.sample(time.time()) if x.source == "host"][:1]
        ['cpu_util_pct']
    """

    name = "host"

    def __init__(self, *, proc: Path = PROC) -> None:
        self._proc = proc
        stat = _read(proc / "stat")
        if stat is None:
            raise SamplerUnavailable(f"{proc / 'stat'} is not readable: not a Linux /proc")
        self._cpu = parse_proc_stat(stat)
        self._psi = self._read_psi()
        self._last_t: float | None = None

    def _read_psi(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for resource in ("cpu", "io", "memory"):
            text = _read(self._proc / "pressure" / resource)
            if text is not None:  # absent on kernels without CONFIG_PSI or with psi=0
                for kind, total_us in parse_pressure(text).items():
                    out[(resource, kind)] = total_us
        return out

    def sample(self, now: float) -> list[Sample]:
        """Read /proc/stat, /proc/meminfo and /proc/pressure once; return host and cpuN samples."""
        out = self._cpu_samples(now)
        out += self._mem_samples(now)
        out += self._psi_samples(now)
        self._last_t = now
        return out

    def _cpu_samples(self, now: float) -> list[Sample]:
        stat = _read(self._proc / "stat")
        if stat is None:
            return []
        cur = parse_proc_stat(stat)
        out: list[Sample] = []
        for name, times in cur.items():
            prev = self._cpu.get(name)
            if prev is None or times.total <= prev.total:
                continue  # no jiffy elapsed (or a core came online): no honest figure
            pct = 100.0 * (times.busy - prev.busy) / (times.total - prev.total)
            source = "host" if name == "cpu" else name
            out.append(Sample(now, source, "cpu_util_pct", max(0.0, min(100.0, pct))))
            if name == "cpu":
                # A VM's stolen time: its threads were runnable but neither on a CPU nor in
                # its run queue, so their CPU clocks and schedstat do not show it.
                steal = 100.0 * (times.steal - prev.steal) / (times.total - prev.total)
                out.append(Sample(now, "host", "steal_pct", max(0.0, min(100.0, steal))))
        self._cpu = cur
        return out

    def _mem_samples(self, now: float) -> list[Sample]:
        text = _read(self._proc / "meminfo")
        if text is None:
            return []
        info = parse_meminfo(text)
        out = [Sample(now, "host", m, float(info[k])) for k, m in _MEMINFO_KEYS.items() if k in info]
        if "MemTotal" in info and "MemAvailable" in info:
            # total - available = what cannot be reclaimed without swapping: the memory that
            # programs hold. Page cache (incl. the dataset) is reclaimable and not "used".
            used = info["MemTotal"] - info["MemAvailable"]
            out.append(Sample(now, "host", "mem_used_bytes", float(used)))
        return out

    def _psi_samples(self, now: float) -> list[Sample]:
        cur = self._read_psi()
        out: list[Sample] = []
        dt = None if self._last_t is None else now - self._last_t
        if dt is not None and dt > 0:
            for key, metric in _PSI_METRICS.items():
                if key in cur and key in self._psi:
                    stalled_s = (cur[key] - self._psi[key]) / 1e6
                    pct = max(0.0, min(100.0, 100.0 * stalled_s / dt))
                    out.append(Sample(now, "host", metric, pct))
        self._psi = cur
        return out


def _cgroup_paths(proc_self_cgroup: str) -> dict[str, str]:
    """Map each controller (and "" for cgroup v2) to this process's cgroup path."""
    out: dict[str, str] = {}
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                out[ctrl] = parts[2]
    return out


def _ancestors(root: Path, rel: str) -> list[Path]:
    """``root/rel`` and each parent up to ``root``: a quota anywhere above also limits us."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return [root.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v1_quota(directory: Path) -> float | None:
    quota = _read(directory / "cpu.cfs_quota_us")
    period = _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0 or int(period) <= 0:
        return None
    return int(quota) / int(period)


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period:
        return None
    return int(quota) / int(period)


def cpu_quota_cores(*, proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """CPU cores this process may use under its cgroup quota, or None when there is no quota.

    Looks at cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` and v2 ``cpu.max`` in this
    process's cgroup and each ancestor, returning the tightest. A container often shows every
    host core in /proc/cpuinfo but may run on fewer: utilization must be read against this.

    Examples:
        >>> cpu_quota_cores() is None or cpu_quota_cores() > 0
        True
    """
    text = _read(proc / "self" / "cgroup")
    if text is None:
        return None
    paths = _cgroup_paths(text)
    found: list[float] = []
    v1_dirs = [cgroup_root / d for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
    if "cpu" in paths:
        for base in v1_dirs:
            found += [q for d in _ancestors(base, paths["cpu"]) if (q := _v1_quota(d)) is not None]
    if "" in paths:
        for base in (cgroup_root, cgroup_root / "unified"):
            found += [q for d in _ancestors(base, paths[""]) if (q := _v2_quota(d)) is not None]
    return min(found) if found else None


def cpu_count() -> int:
    """CPUs this process may be scheduled on (affinity), which can be fewer than the host's."""
    return len(os.sched_getaffinity(0))


def env_facts(*, proc: Path = PROC, cgroup_root: Path = CGROUP_ROOT) -> Mapping[str, tuple[object, str]]:
    """Machine facts for the run's facts table: key -> (value, how measured)."""
    return {
        "env.cpu_count": (cpu_count(), "os.sched_getaffinity(0): CPUs this process may run on"),
        "env.cpu_quota_cores": (
            cpu_quota_cores(proc=proc, cgroup_root=cgroup_root),
            "cgroup cpu.cfs_quota_us/cpu.cfs_period_us (v1) or cpu.max (v2), tightest ancestor; "
            "null = no quota",
        ),
        # cuda:N counts the devices this mask leaves, not NVML's gpuN (analysis/gpu_identity.py)
        "env.cuda_visible_devices": (os.environ.get("CUDA_VISIBLE_DEVICES"),
                                     "CUDA_VISIBLE_DEVICES of the recording process"),
        "env.cpu_bf16": (_cpu_bf16(proc), "/proc/cpuinfo flags: avx512_bf16 or amx_bf16 "
                                          "(native bf16 math on this CPU)"),
    }


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """``(model name, flags)`` of the first CPU in /proc/cpuinfo text (arm64 says "Features").

    Examples:
        >>> name, flags = parse_cpuinfo("model name\\t: Zen\\nflags\\t\\t: sse2 avx2\\n")
        >>> name, sorted(flags)
        ('Zen', ['avx2', 'sse2'])
    """
    name, flags = "unknown", frozenset[str]()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            continue
        if key == "model name" and name == "unknown":
            name = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return name, flags


def _cpu_bf16(proc: Path) -> bool | None:
    """Whether the CPU does bf16 math natively (None when /proc/cpuinfo cannot be read)."""
    try:
        text = (proc / "cpuinfo").read_text()
    except OSError:
        return None
    return cpu_has_native_bf16(parse_cpuinfo(text)[1])
