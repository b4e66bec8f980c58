"""Page-cache residency of dataset files, and eviction for cold-cache runs.

Residency is asked of the kernel without reading the files: the ``cachestat`` syscall (Linux
6.5+) counts cached pages of an open file; on older kernels we map the file (no page is read by
mapping it) and ``mincore`` says which pages are resident. Either way the cost is opening the
file, a few microseconds; no data moves.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from stepscope.store.records import Sample

PAGE_BYTES = mmap.PAGESIZE
_SYS_CACHESTAT = 451  # same number on x86_64 and aarch64 (the unified syscall table)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def _cachestat_pages(fd: int) -> int | None:
    """Cached pages of the whole file (len 0 = to the end), or None without the syscall."""
    rng, out = _CachestatRange(0, 0), _Cachestat()
    if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(out), 0) != 0:
        return None
    return int(out.nr_cache)


def _mincore_pages(fd: int, size: int) -> int:
    """Resident pages of an ``size``-byte file via mmap + mincore (bit 0 of each vector byte)."""
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        raise OSError(ctypes.get_errno(), "mmap failed")
    try:
        pages = (size + PAGE_BYTES - 1) // PAGE_BYTES
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return sum(b & 1 for b in bytes(vec))
    finally:
        _libc.munmap(addr, size)


def _probe_cachestat() -> bool:
    fd = os.open("/proc/self/exe", os.O_RDONLY)
    try:
        return _cachestat_pages(fd) is not None
    finally:
        os.close(fd)


HAVE_CACHESTAT = _probe_cachestat()


def resident_bytes(path: Path, *, method: str | None = None) -> tuple[int, int]:
    """``(resident_bytes, file_bytes)`` of one file in the page cache.

    Args:
        path: a regular file.
        method: "cachestat" or "mincore"; None picks cachestat where the kernel has it.

    Examples:
        >>> resident_bytes(Path("/etc/hostname"))  # doctest: +SKIP
        (4096, 13)
    """
    use_cachestat = HAVE_CACHESTAT if method is None else method == "cachestat"
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        pages = _cachestat_pages(fd) if use_cachestat else _mincore_pages(fd, size)
        if pages is None:
            pages = _mincore_pages(fd, size)
        # the last page is counted whole; a file is never more than fully resident
        return min(size, pages * PAGE_BYTES), size
    finally:
        os.close(fd)


def evict(files: Iterable[Path], *, sync: bool = False) -> None:
    """Drop the files' clean pages from the page cache (``POSIX_FADV_DONTNEED``).

    Dirty pages (written but not yet on disk) are not dropped: DONTNEED only starts their
    writeback. Files just written must be synced first: pass ``sync=True`` (``fdatasync`` per
    file) or call ``os.sync()``. Pages mapped by a running process also stay.

    Examples:
        >>> evict(dataset_files, sync=True)  # the next epoch reads from the disk
    """
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            if sync:
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class DatasetResidency:
    """``pagecache`` sampler: the byte-weighted fraction of the dataset in the page cache.

    Args:
        files: every dataset file.
        max_files: above this many, a random sample of this size is checked (``sample_files``);
            record ``dataset.residency_sample_files`` so the report can say so.
        seed: the sample's seed, so repeated runs check the same files.

    Examples:
        >>> res = DatasetResidency(files)
        >>> evict(files); res.resident_frac()
        0.0
    """

    name = "pagecache"

    def __init__(self, files: Sequence[Path], *, max_files: int = 2000, seed: int = 0) -> None:
        self.files_total = len(files)
        chosen = list(files)
        if len(chosen) > max_files:
            chosen = random.Random(seed).sample(chosen, max_files)
        self.sample_files: list[Path] = chosen
        self.sampled = len(chosen) < len(files)
        self._sizes = {p: _size(p) for p in chosen}
        self.total_bytes = sum(self._sizes.values())

    def resident_frac(self) -> float:
        """Resident bytes / file bytes over the sampled files (files gone since are skipped).

        Sizes are those found at construction: skipping an ``fstat`` per file per sample is a
        third of the cost, and dataset files do not change size during training.
        """
        resident = total = 0
        for path, size in self._sizes.items():
            if size == 0:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                pages = _cachestat_pages(fd) if HAVE_CACHESTAT else None
                if pages is None:
                    pages = _mincore_pages(fd, size)
            except OSError:
                continue
            finally:
                os.close(fd)
            resident, total = resident + min(size, pages * PAGE_BYTES), total + size
        return resident / total if total else 0.0

    def sample(self, now: float) -> list[Sample]:
        """One ``pagecache``/``dataset_resident_frac`` sample."""
        return [Sample(now, "pagecache", "dataset_resident_frac", self.resident_frac())]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
