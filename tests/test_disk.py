"""Disk sampler: the real device under the test's temporary directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stepscope.observe.base import SamplerUnavailable
from stepscope.observe.disk import (
    DiskSampler,
    block_device_for,
    create_disk_samplers,
    read_diskstats,
)
from stepscope.observe.pagecache import evict

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


MB = 1 << 20


def _device_or_skip(path: Path) -> DiskSampler:
    dev = block_device_for(path)
    if dev is None:
        pytest.skip(f"{path} is on no block device here (tmpfs?)")
    return DiskSampler(dev)


def test_block_device_is_a_whole_disk_listed_in_diskstats(tmp_path: Path) -> None:
    dev = block_device_for(tmp_path)
    if dev is None:
        pytest.skip(f"{tmp_path} is on no block device here")
    assert Path(f"/sys/block/{dev.name}").exists()  # a whole disk, not a partition
    assert read_diskstats(dev.name) is not None
    assert dev.dev == f"{dev.major}:{dev.minor}"


def test_tmpfs_has_no_block_device() -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    assert block_device_for(Path("/dev/shm")) is None


def test_cold_read_shows_as_read_throughput_at_the_injected_time(tmp_path: Path) -> None:
    sampler = _device_or_skip(tmp_path)
    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(4 * MB))
    evict([f], sync=True)
    assert sampler.sample(50.0) == []  # the first call only sets the baseline time
    f.read_bytes()
    got = {s.metric: s.value for s in sampler.sample(54.0)}
    assert set(got) == {"read_bytes_per_s", "write_bytes_per_s", "busy_pct"}
    # the 4 MB (plus whatever else the machine read) over exactly 4 s of the injected clock
    assert got["read_bytes_per_s"] >= 4 * MB / 4.0
    assert 0.0 <= got["busy_pct"] <= 100.0
    assert all(s.source == sampler.name for s in sampler.sample(55.0))


def test_create_disk_samplers_dedups_devices(tmp_path: Path) -> None:
    if block_device_for(tmp_path) is None:
        pytest.skip(f"{tmp_path} is on no block device here")
    (tmp_path / "a").mkdir()
    files = [tmp_path / "a" / "1.jpg", tmp_path / "2.jpg"]
    for f in files:
        f.write_bytes(b"x")
    samplers = create_disk_samplers(files)
    assert len(samplers) == 1 and samplers[0].name.startswith("disk:")


def test_create_disk_samplers_on_tmpfs_is_unavailable() -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    with pytest.raises(SamplerUnavailable, match="no block device"):
        create_disk_samplers([Path("/dev/shm/x.jpg")])
