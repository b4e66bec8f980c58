"""blkio throttling, for real: a cold 8 MB read at 4 MB/s takes about 2 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepscope.errors import StepscopeError
from stepscope.observe.blkio import BlkioThrottle, blkio_available
from stepscope.observe.disk import block_device_for
from stepscope.observe.pagecache import evict

MB = 1_000_000
AVAILABLE, WHY = blkio_available()
needs_blkio = pytest.mark.skipif(not AVAILABLE, reason=f"blkio throttling unusable: {WHY}")


def _cold_file(tmp_path: Path, size: int) -> Path:
    if block_device_for(tmp_path) is None:
        pytest.skip(f"{tmp_path} is on no block device: nothing to throttle")
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(size))
    evict([f], sync=True)
    return f


def _timed_read_in_child(f: Path, throttle: BlkioThrottle | None) -> float:
    """Seconds a fresh process takes to read ``f`` whole, started inside the throttle group."""
    code = "import sys; print(sys.stdin.readline()); open(sys.argv[1], 'rb').read()"
    child = subprocess.Popen([sys.executable, "-c", code, str(f)], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, text=True)
    assert child.stdin is not None
    if throttle is not None:
        throttle.add_pid(child.pid)
    t0 = time.monotonic()
    child.stdin.write("go\n")
    child.stdin.close()
    child.wait()
    return time.monotonic() - t0


def test_availability_has_a_reason() -> None:
    ok, why = blkio_available()
    assert isinstance(ok, bool) and why


@pytest.mark.root
@needs_blkio
def test_throttle_slows_a_cold_read_to_the_set_rate(tmp_path: Path) -> None:
    f = _cold_file(tmp_path, 8 * MB)
    with BlkioThrottle(f, 4 * MB) as throttle:
        group = throttle.group
        slow_s = _timed_read_in_child(f, throttle)
    assert not group.exists()  # removed on exit
    evict([f])
    fast_s = _timed_read_in_child(f, None)
    print(f"8 MB cold read: {slow_s:.2f} s throttled at 4 MB/s, {fast_s:.2f} s unthrottled")
    assert 1.4 <= slow_s <= 4.0  # 2 s by the rate; the throttle lets a first burst through
    assert fast_s < slow_s / 2


@pytest.mark.root
@needs_blkio
def test_cached_reads_are_not_throttled(tmp_path: Path) -> None:
    f = _cold_file(tmp_path, 8 * MB)
    f.read_bytes()  # now in the page cache
    with BlkioThrottle(f, 1 * MB) as throttle:
        assert _timed_read_in_child(f, throttle) < 2.0  # 8 s if it went to the disk


@pytest.mark.root
@needs_blkio
def test_group_is_removed_even_with_members_left(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with BlkioThrottle(tmp_path, 1 * MB) as throttle:
            throttle.add_pid(child.pid)
            group = throttle.group
            assert str(child.pid) in (group / "cgroup.procs").read_text().split()
        assert not group.exists()
        assert "stepscope" not in Path(f"/proc/{child.pid}/cgroup").read_text()
    finally:
        child.kill()
        child.wait()


def test_path_on_no_block_device_is_refused() -> None:
    if not AVAILABLE:
        pytest.skip(f"blkio throttling unusable: {WHY}")
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with pytest.raises(StepscopeError, match="no block device"):
        BlkioThrottle(Path("/dev/shm"), MB)
