"""The block device holding a path, and its throughput and busy time from /proc/diskstats."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stepscope.observe.base import SamplerUnavailable
from stepscope.store.records import Sample

PROC = Path("/proc")
SYS = Path("/sys")
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size


@dataclass(frozen=True)
class BlockDevice:
    """A whole disk: its kernel name (``vda``, ``nvme0n1``) and ``major:minor``."""

    name: str
    major: int
    minor: int

    @property
    def dev(self) -> str:
        return f"{self.major}:{self.minor}"


def _mount_source(path: Path, proc: Path) -> tuple[str, str, str] | None:
    """(fstype, source, super options) of the mount holding ``path``, from mountinfo."""
    try:
        lines = (proc / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, tuple[str, str, str]] | None = None
    target = str(path.resolve())
    for line in lines:
        left, _, right = line.partition(" - ")
        mount_point = left.split()[4]
        fstype, source, opts = [*right.split(), "", "", ""][:3]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) > best[0]):
            best = (len(mount_point), (fstype, source, opts))
    return best[1] if best else None


def _dev_numbers(path: Path, proc: Path) -> tuple[int, int] | None:
    """major:minor of the block device behind ``path``.

    Overlay, tmpfs and other virtual filesystems report an anonymous device (major 0); for an
    overlay we follow its ``upperdir`` (where new files land) or a ``/dev/...`` mount source.
    """
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major != 0:
        return major, minor
    mount = _mount_source(path, proc)
    if mount is None:
        return None
    fstype, source, opts = mount
    if source.startswith("/dev/") and os.path.exists(source):
        rdev = os.stat(source).st_rdev
        return os.major(rdev), os.minor(rdev)
    if fstype == "overlay":
        upper = next((o[len("upperdir="):] for o in opts.split(",") if o.startswith("upperdir=")), "")
        if upper and os.path.exists(upper) and os.major(os.stat(upper).st_dev) != 0:
            return _dev_numbers(Path(upper), proc)
    return None


def block_device_for(path: Path, *, proc: Path = PROC, sys: Path = SYS) -> BlockDevice | None:
    """The whole disk holding ``path`` (a partition maps to its parent disk), or None when the
    path lives on no block device (tmpfs, a network filesystem).

    Examples:
        >>> block_device_for(Path("/")).name  # doctest: +SKIP
        'vda'
    """
    numbers = _dev_numbers(path, proc)
    if numbers is None:
        return None
    link = sys / "dev" / "block" / f"{numbers[0]}:{numbers[1]}"
    if not link.exists():
        return None
    node = link.resolve()
    if (node / "partition").exists():  # statistics and throttles are per whole disk
        node = node.parent
    try:
        major, minor = (int(x) for x in (node / "dev").read_text().strip().split(":"))
    except (OSError, ValueError):
        return None
    return BlockDevice(node.name, major, minor)


def read_diskstats(name: str, *, proc: Path = PROC) -> tuple[int, int, int] | None:
    """``(read_bytes, written_bytes, io_ticks_ms)`` cumulative for device ``name``."""
    try:
        text = (proc / "diskstats").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 13 and f[2] == name:
            return int(f[5]) * SECTOR_BYTES, int(f[9]) * SECTOR_BYTES, int(f[12])
    return None


class DiskSampler:
    """``disk:<dev>`` series: read/write bytes per second and busy percent (time with at least
    one request in flight; 100 % on an SSD or a virtual disk does not mean saturated, since
    they serve many requests at once).

    Examples:
        >>> s = DiskSampler(block_device_for(Path("data")))
        >>> s.sample(time.time())
    """

    def __init__(self, device: BlockDevice, *, proc: Path = PROC) -> None:
        self.device = device
        self.name = f"disk:{device.name}"
        self._proc = proc
        first = read_diskstats(device.name, proc=proc)
        if first is None:
            raise SamplerUnavailable(f"device {device.name} is not in {proc / 'diskstats'}")
        self._prev = first
        self._prev_t: float | None = None

    def sample(self, now: float) -> list[Sample]:
        """Rates since the previous call (the first call only sets the baseline time)."""
        cur = read_diskstats(self.device.name, proc=self._proc)
        if cur is None:
            return []
        prev, prev_t = self._prev, self._prev_t
        self._prev, self._prev_t = cur, now
        if prev_t is None or now <= prev_t:
            return []
        dt = now - prev_t
        busy_pct = min(100.0, 100.0 * (cur[2] - prev[2]) / 1000.0 / dt)
        return [
            Sample(now, self.name, "read_bytes_per_s", (cur[0] - prev[0]) / dt),
            Sample(now, self.name, "write_bytes_per_s", (cur[1] - prev[1]) / dt),
            Sample(now, self.name, "busy_pct", max(0.0, busy_pct)),
        ]


def create_disk_samplers(files: Sequence[Path], *, max_dirs: int = 64) -> list[DiskSampler]:
    """One sampler per disk holding the dataset (or the working directory when no files are
    given). Only the first ``max_dirs`` distinct directories are looked at: a dataset rarely
    spans disks and stat-ing every file would cost seconds on a big one."""
    dirs: list[Path] = []
    for f in files:
        if f.parent not in dirs:
            dirs.append(f.parent)
            if len(dirs) >= max_dirs:
                break
    where = dirs or [Path.cwd()]
    devices: dict[str, BlockDevice] = {}
    for d in where:
        dev = block_device_for(d) if d.exists() else None
        if dev is not None:
            devices[dev.name] = dev
    if not devices:
        raise SamplerUnavailable(
            f"{where[0]} is on no block device (tmpfs, network or virtual filesystem): "
            "disk throughput not sampled"
        )
    return [DiskSampler(dev) for dev in devices.values()]
