"""Page-cache residency and eviction on real files (root needed for nothing here)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stepscope.observe import pagecache
from stepscope.observe.pagecache import DatasetResidency, evict, resident_bytes

METHODS = ["mincore"] + (["cachestat"] if pagecache.HAVE_CACHESTAT else [])


def _files(root: Path, n: int, size: int) -> list[Path]:
    out = []
    for i in range(n):
        p = root / f"img{i:04d}.jpg"
        p.write_bytes(os.urandom(size))
        out.append(p)
    return out


@pytest.mark.parametrize("method", METHODS)
def test_resident_bytes_goes_from_zero_to_full_after_evict_and_read(
    tmp_path: Path, method: str
) -> None:
    (f,) = _files(tmp_path, 1, 300_000)
    evict([f], sync=True)
    assert resident_bytes(f, method=method) == (0, 300_000)
    f.read_bytes()
    assert resident_bytes(f, method=method) == (300_000, 300_000)


def test_cachestat_and_mincore_agree_on_a_half_read_file(tmp_path: Path) -> None:
    if not pagecache.HAVE_CACHESTAT:
        pytest.skip("kernel has no cachestat syscall (Linux < 6.5)")
    (f,) = _files(tmp_path, 1, 1 << 20)
    evict([f], sync=True)
    with f.open("rb") as fh:
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past the read
        fh.read(256 * 1024)
    by_cachestat = resident_bytes(f, method="cachestat")[0]
    assert by_cachestat == resident_bytes(f, method="mincore")[0]
    assert 256 * 1024 <= by_cachestat < 1 << 20


def test_empty_file_is_zero_of_zero(tmp_path: Path) -> None:
    f = tmp_path / "empty"
    f.touch()
    assert resident_bytes(f) == (0, 0)


def test_dataset_residency_fraction_is_byte_weighted(tmp_path: Path) -> None:
    small, big = _files(tmp_path, 1, 100_000)[0], tmp_path / "big"
    big.write_bytes(os.urandom(300_000))
    res = DatasetResidency([small, big])
    evict([small, big], sync=True)
    assert res.resident_frac() == 0.0
    big.read_bytes()
    assert res.resident_frac() == pytest.approx(0.75, abs=0.02)
    small.read_bytes()
    (sample,) = res.sample(123.0)
    assert (sample.t, sample.source, sample.metric) == (123.0, "pagecache", "dataset_resident_frac")
    assert sample.value == pytest.approx(1.0)
    assert res.total_bytes == 400_000 and not res.sampled


def test_large_dataset_is_sampled_reproducibly(tmp_path: Path) -> None:
    files = _files(tmp_path, 50, 10)
    a = DatasetResidency(files, max_files=10, seed=3)
    b = DatasetResidency(files, max_files=10, seed=3)
    assert a.sample_files == b.sample_files and len(a.sample_files) == 10
    assert a.sampled and a.files_total == 50 and a.total_bytes == 100


def test_residency_of_2000_files_costs_a_few_ms(tmp_path: Path) -> None:
    files = _files(tmp_path, 2000, 4096)
    res = DatasetResidency(files)
    res.resident_frac()  # first pass warms the dentry cache, as every later sample finds it
    t0 = time.thread_time()
    res.resident_frac()
    cost_ms = (time.thread_time() - t0) * 1000
    print(f"residency of 2000 files: {cost_ms:.1f} ms CPU")
    assert cost_ms < 60  # a few ms alone; generous for a loaded 2-core CI box


def test_files_deleted_after_construction_are_skipped(tmp_path: Path) -> None:
    a, b = _files(tmp_path, 2, 8192)
    res = DatasetResidency([a, b])
    b.unlink()
    a.read_bytes()
    assert res.resident_frac() == pytest.approx(1.0)
