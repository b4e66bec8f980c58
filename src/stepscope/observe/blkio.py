"""A real storage bottleneck on demand: a cgroup-v1 blkio group that caps physical reads from the
disk holding a path.

Only reads that reach the disk are throttled; page-cache hits are not, so evict the files first
(``pagecache.evict``) for a cold, slow epoch. Processes forked after a PID joins the group
inherit it (DataLoader workers started later are throttled too); already running children are
not, so add the main process before its workers start, or add each worker.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path
from types import TracebackType

from stepscope.errors import StepscopeError
from stepscope.observe.disk import block_device_for

BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")
_counter = itertools.count()


def _blkio_mount(proc: Path = Path("/proc")) -> Path | None:
    """Where the cgroup-v1 blkio hierarchy is mounted, from /proc/self/mounts."""
    try:
        lines = (proc / "self" / "mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if len(f) >= 4 and f[2] == "cgroup" and "blkio" in f[3].split(","):
            return Path(f[1])
    return None


def blkio_available() -> tuple[bool, str]:
    """``(usable, reason)``: whether a throttle group can be made here, and if not, why.

    Examples:
        >>> ok, why = blkio_available()
    """
    root = _blkio_mount()
    if root is None:
        return False, "no cgroup-v1 blkio hierarchy is mounted (cgroup v2 only, or a container)"
    if not (root / "blkio.throttle.read_bps_device").exists():
        return False, f"{root} has no blkio.throttle.read_bps_device (kernel built without it)"
    if not os.access(root, os.W_OK):
        return False, f"{root} is not writable: throttling needs root outside a read-only mount"
    return True, f"cgroup-v1 blkio at {root}"


def _own_blkio_cgroup(pid: int, root: Path) -> Path:
    """The blkio group ``pid`` is in now, to put it back there on exit."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, rel = line.split(":", 2)
            if "blkio" in controllers.split(","):
                return root / rel.lstrip("/")
    except (OSError, ValueError):
        pass
    return root


class BlkioThrottle:
    """Caps physical reads from the disk holding ``path`` at ``bytes_per_s`` for added PIDs.

    The group is created on ``__enter__`` and removed on ``__exit__``, after moving every
    process still in it back to where it came from (a group with members cannot be removed).

    Raises:
        StepscopeError: blkio is unusable here, or ``path`` is on no block device.

    Examples:
        >>> with BlkioThrottle(Path("data"), 4_000_000) as throttle:
        ...     throttle.add_pid(os.getpid())
        ...     read_the_dataset()
    """

    def __init__(self, path: Path, bytes_per_s: int) -> None:
        ok, why = blkio_available()
        if not ok:
            raise StepscopeError(f"cannot throttle reads: {why}; run without the throttle")
        device = block_device_for(path)
        if device is None:
            raise StepscopeError(
                f"cannot throttle reads of {path}: it is on no block device (tmpfs, network "
                "filesystem); put the dataset on a local disk"
            )
        self.device = device
        self.bytes_per_s = int(bytes_per_s)
        self.root = _blkio_mount() or BLKIO_ROOT
        self.group = self.root / f"stepscope-{os.getpid()}-{next(_counter)}"
        self._origins: dict[int, Path] = {}

    def __enter__(self) -> BlkioThrottle:
        self.group.mkdir()
        try:
            # Throttle rules name the whole disk; a partition's numbers are rejected (ENODEV).
            (self.group / "blkio.throttle.read_bps_device").write_text(
                f"{self.device.dev} {self.bytes_per_s}\n"
            )
        except OSError:
            self.group.rmdir()
            raise
        return self

    def add_pid(self, pid: int) -> None:
        """Move ``pid`` (all its threads) into the throttled group."""
        self._origins.setdefault(pid, _own_blkio_cgroup(pid, self.root))
        (self.group / "cgroup.procs").write_text(f"{pid}\n")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Move members back and remove the group (idempotent)."""
        if not self.group.exists():
            return
        # members forked inside the group go where the first added process came from
        default = next(iter(self._origins.values()), self.root)
        for _ in range(20):
            self._evacuate(default)
            try:
                self.group.rmdir()
                return
            except OSError:  # EBUSY: a member forked or was still exiting; move it too
                time.sleep(0.05)
        self.group.rmdir()

    def _evacuate(self, default: Path) -> None:
        for pid_text in (self.group / "cgroup.procs").read_text().split():
            pid = int(pid_text)
            origin = self._origins.get(pid, default)
            try:
                (origin / "cgroup.procs").write_text(f"{pid}\n")
            except OSError:  # exited meanwhile, or its group vanished: try the root group
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
