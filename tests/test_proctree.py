"""The process tree on real processes: a child that reads a cold file, and a real DataLoader."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.observe.pagecache import evict
from stepscope.observe.proctree import ProcessTree, parse_io, parse_stat, parse_uss
from stepscope.store.records import Sample

MB = 1 << 20


def _cold_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    evict([path], sync=True)
    return path


def _value(samples: list[Sample], source: str, metric: str) -> float:
    (v,) = [s.value for s in samples if s.source == source and s.metric == metric]
    return v


def _reader_child(path: Path) -> subprocess.Popen[str]:
    """A child that reads ``path`` whole, says so, and waits for its stdin to close."""
    code = (
        "import sys; data = open(sys.argv[1], 'rb').read(); print(len(data), flush=True); "
        "sys.stdin.read()"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert int(child.stdout.readline()) == path.stat().st_size
    return child


@pytest.mark.parametrize("discovery", ["children", "scan"])
def test_child_physical_reads_show_in_its_own_series_and_survive_its_exit(
    tmp_path: Path, discovery: str
) -> None:
    if discovery == "children" and not Path(f"/proc/self/task/{os.getpid()}/children").exists():
        pytest.skip("kernel without /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")
    f = _cold_file(tmp_path / "data.bin", 6 * MB)
    tree = ProcessTree(os.getpid(), discovery=discovery)
    before = tree.sample(1000.0)
    child = _reader_child(f)
    try:
        mid_phase = tree.io_totals()  # a phase boundary between samples must not eat the rate
        alive = tree.sample(1002.0)
        assert _value(alive, "tree", "read_bytes") >= mid_phase[0] >= 6 * MB
        own = _value(alive, f"proc:{child.pid}", "read_bytes")
        assert 6 * MB <= own <= 6 * MB + 2 * MB  # readahead may round up, never past EOF much
        grown = _value(alive, "tree", "read_bytes") - _value(before, "tree", "read_bytes")
        assert grown >= 6 * MB
        # the injected clock drives the rate: bytes over exactly two seconds
        assert _value(alive, "tree", "read_rate_bytes_per_s") == pytest.approx(grown / 2.0)
        assert _value(alive, f"proc:{child.pid}", "rchar_bytes") >= 6 * MB
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()  # reaped: the kernel adds the child's counters to ours
    after = tree.sample(1003.0)
    assert not [s for s in after if s.source == f"proc:{child.pid}"]
    assert _value(after, "tree", "read_bytes") >= _value(alive, "tree", "read_bytes")
    assert tree.io_totals()[0] >= _value(alive, "tree", "read_bytes")


def test_new_processes_reports_roles_and_last_seen(tmp_path: Path) -> None:
    f = tmp_path / "small.bin"
    f.write_bytes(b"x" * 100)
    tree = ProcessTree(os.getpid(), clock=lambda: 5.0)
    first = {p.pid: p for p in tree.new_processes()}
    assert first[os.getpid()].role == "main" and first[os.getpid()].first_t == 5.0
    assert tree.new_processes() == []  # nothing new since
    child = _reader_child(f)
    try:
        tree.sample(7.0)
        seen = {p.pid: p for p in tree.new_processes()}
        assert seen[child.pid].role == "child" and seen[child.pid].ppid == os.getpid()
        assert seen[child.pid].name.startswith("python")
        assert seen[os.getpid()].last_t == 7.0 and seen[os.getpid()].first_t == 5.0
        assert child.pid in tree.pids()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_cpu_util_uses_the_injected_clock() -> None:
    tree = ProcessTree(os.getpid())
    tree.sample(10.0)
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:  # burn ~0.3 s of CPU
        pass
    samples = tree.sample(11.0)  # pretend one second passed: ~30 % of a core
    pct = _value(samples, f"proc:{os.getpid()}", "cpu_util_pct")
    assert 20 <= pct <= 60
    assert _value(samples, "tree", "cpu_util_pct") >= pct


def test_uss_is_read_on_its_own_schedule_one_process_per_sample(tmp_path: Path) -> None:
    tree = ProcessTree(os.getpid(), uss_interval_s=5.0)
    first = tree.sample(0.0)
    uss = _value(first, f"proc:{os.getpid()}", "uss_bytes")
    assert 0 < uss <= _value(first, f"proc:{os.getpid()}", "rss_bytes")
    assert _value(first, "tree", "uss_bytes") == uss
    assert not [s for s in tree.sample(1.0) if s.metric == "uss_bytes"]
    (tmp_path / "f").write_bytes(b"x")
    child = _reader_child(tmp_path / "f")
    try:
        with_child = tree.sample(2.0)  # the newcomer's USS is due, ours is not
        assert [s.source for s in with_child if s.metric == "uss_bytes"] == [
            f"proc:{child.pid}", "tree"]
        assert _value(with_child, "tree", "uss_bytes") == uss + _value(
            with_child, f"proc:{child.pid}", "uss_bytes")
        assert [s.source for s in tree.sample(5.0) if s.metric == "uss_bytes"] == [
            f"proc:{os.getpid()}", "tree"]
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_without_root_a_departed_childs_last_reads_are_kept(tmp_path: Path) -> None:
    f = _cold_file(tmp_path / "data.bin", 2 * MB)
    tree = ProcessTree(os.getpid(), include_root=False)
    child = _reader_child(f)
    assert child.stdin is not None
    tree.sample(1.0)
    assert os.getpid() not in tree.pids()
    child.stdin.close()
    child.wait()
    assert tree.io_totals()[0] >= 2 * MB


def test_missing_root_is_unavailable() -> None:
    from stepscope.observe.base import SamplerUnavailable

    with pytest.raises(SamplerUnavailable, match="not found"):
        ProcessTree(2**22 + 12345)


# -- a real DataLoader ---------------------------------------------------------------------------
class _FileDataset:
    """Reads one file per item, in the worker process."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> int:
        return len(self.files[i].read_bytes())


def test_dataloader_workers_are_found_with_role_and_own_reads(tmp_path: Path) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    files = [_cold_file(tmp_path / f"{i}.jpg", 512 * 1024) for i in range(8)]
    tree = ProcessTree(os.getpid())
    start = tree.sample(0.0)
    loader = torch_data.DataLoader(_FileDataset(files), batch_size=None, num_workers=2,
                                   multiprocessing_context="fork")
    it = iter(loader)
    assert sum(next(it) for _ in range(len(files))) == 8 * 512 * 1024  # no StopIteration yet
    during = tree.sample(1.0)
    workers = [p for p in tree.processes() if p.role == "worker"]
    assert len(workers) == 2 and _value(during, "tree", "workers") == 2
    worker_reads = [_value(during, f"proc:{w.pid}", "read_bytes") for w in workers]
    assert all(r >= 512 * 1024 for r in worker_reads)  # each read its share itself
    assert sum(worker_reads) >= 8 * 512 * 1024
    assert _value(during, "tree", "read_bytes") - _value(start, "tree", "read_bytes") >= 4 * MB
    del it  # workers exit and are reaped by this process
    deadline = time.time() + 10
    while any(p.role == "worker" for p in tree.processes()) and time.time() < deadline:
        tree.sample(2.0)
        time.sleep(0.05)
    after = tree.sample(3.0)
    assert _value(after, "tree", "workers") == 0
    assert _value(after, "tree", "read_bytes") >= _value(during, "tree", "read_bytes")


@pytest.mark.slow
def test_spawned_dataloader_workers_are_workers(tmp_path: Path) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    files = [_cold_file(tmp_path / f"{i}.jpg", 64 * 1024) for i in range(4)]
    tree = ProcessTree(os.getpid())
    loader = torch_data.DataLoader(_FileDataset(files), batch_size=None, num_workers=2,
                                   multiprocessing_context="spawn")
    it = iter(loader)
    next(it)
    tree.sample(0.0)
    roles = {p.pid: p.role for p in tree.processes()}
    del it
    assert list(roles.values()).count("worker") == 2
    assert list(roles.values()).count("child") <= 1  # multiprocessing's resource tracker


# -- parsers -------------------------------------------------------------------------------------
@given(st.text(alphabet=st.characters(blacklist_characters="\0\n"), max_size=15))
def test_parse_stat_survives_any_comm(comm: str) -> None:
    fields = "S 1 2 3 4 5 6 7 8 9 10 100 50 0 0 20 0 7 0 12345 999 42 rest"
    st_ = parse_stat(77, f"77 ({comm}) {fields}")
    assert (st_.comm, st_.state, st_.ppid, st_.cpu_ticks, st_.threads, st_.start_ticks) == (
        comm, "S", 1, 150, 7, 12345)
    assert st_.rss_bytes == 42 * os.sysconf("SC_PAGE_SIZE")


def test_parse_io_and_uss() -> None:
    assert parse_io("rchar: 10\nwchar: 3\nread_bytes: 4096\nwrite_bytes: 0\n") == (4096, 10)
    rollup = "Rss: 100 kB\nPrivate_Clean: 3 kB\nPrivate_Dirty: 5 kB\nShared_Clean: 9 kB\n"
    assert parse_uss(rollup) == 8 * 1024


def test_a_child_born_between_samples_has_its_whole_cpu_counted() -> None:
    """Planted: a child that burns ~0.3 s of CPU and sleeps, born after one sample and first
    seen at the next. Its CPU since its start is that interval's (it did not exist before):
    its own series and the tree's both hold it, where the first sighting used to read none."""
    tree = ProcessTree(os.getpid())
    code = ("import time, sys; t = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\n"
            "print('done', flush=True); sys.stdin.read()")
    t0 = time.time()
    tree.sample(t0)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        t1 = time.time()
        samples = tree.sample(t1)
        burnt = 0.3 + 0.02  # the loop, and the interpreter's start (a few tens of ms)
        pct = _value(samples, f"proc:{child.pid}", "cpu_util_pct")
        assert pct >= 100 * 0.3 / (t1 - t0) * 0.8, (pct, t1 - t0)
        assert pct <= 100 * (burnt + 0.15) / (t1 - t0) * 1.2 + 5, (pct, t1 - t0)
        assert _value(samples, "tree", "cpu_util_pct") >= pct
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
