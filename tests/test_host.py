"""Host sampler: the real /proc here, and exact figures from a hand-written /proc tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.observe.host import (
    HostSampler,
    cpu_count,
    cpu_quota_cores,
    env_facts,
    parse_meminfo,
    parse_pressure,
    parse_proc_stat,
)
from stepscope.store.records import Sample

EXPECTED_HOST = {"cpu_util_pct", "mem_total_bytes", "mem_used_bytes", "mem_available_bytes",
                 "mem_cached_bytes", "mem_shmem_bytes"}


def _by_key(samples: list[Sample]) -> dict[tuple[str, str], float]:
    return {(s.source, s.metric): s.value for s in samples}


def test_real_host_sample_has_every_core_and_memory() -> None:
    sampler = HostSampler()
    time.sleep(0.05)  # several 10 ms jiffies pass on every core, busy or idle
    samples = sampler.sample(1.0)
    got = _by_key(samples)
    assert {m for (src, m) in got if src == "host"} >= EXPECTED_HOST
    cores = [src for (src, m) in got if src.startswith("cpu")]
    assert len(cores) == os.cpu_count()
    assert all(0.0 <= s.value <= 100.0 for s in samples if s.metric.endswith("_pct"))
    assert got[("host", "mem_used_bytes")] < got[("host", "mem_total_bytes")]


def test_real_pressure_appears_from_the_second_sample() -> None:
    if not Path("/proc/pressure/io").exists():
        pytest.skip("kernel without PSI (/proc/pressure): the series are simply absent")
    sampler = HostSampler()
    assert "psi_io_some_pct" not in {s.metric for s in sampler.sample(100.0)}
    assert "psi_io_some_pct" in {s.metric for s in sampler.sample(101.0)}


def _fake_proc(root: Path, cpu: list[int], io_some_us: int, mem_kb: int) -> Path:
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    line = " ".join(str(v) for v in cpu)
    (root / "stat").write_text(f"cpu  {line}\ncpu0 {line}\nintr 1 2 3\n")
    (root / "meminfo").write_text(
        f"MemTotal: {mem_kb} kB\nMemFree: 10 kB\nMemAvailable: {mem_kb // 4} kB\n"
        f"Cached: 300 kB\nShmem: 20 kB\nHugePages_Total: 0\n"
    )
    (root / "pressure" / "io").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={io_some_us}\n"
        f"full avg10=0.00 avg60=0.00 avg300=0.00 total={io_some_us // 2}\n"
    )
    return root


def _sampled_across(tmp_path: Path, cpu_after: list[int], io_some_us: int
                    ) -> dict[tuple[str, str], float]:
    """The samples over 2 s from a fixed baseline /proc tree to one with ``cpu_after``."""
    proc = _fake_proc(tmp_path, [100, 0, 50, 800, 50, 0, 0, 0], 0, 4000)
    sampler = HostSampler(proc=proc)
    sampler.sample(10.0)
    _fake_proc(tmp_path, cpu_after, io_some_us, 4000)
    return _by_key(sampler.sample(12.0))


def test_exact_figures_from_known_counters(tmp_path: Path) -> None:
    # 200 more jiffies: 60 user + 20 system busy, 100 idle + 20 iowait not busy
    got = _sampled_across(tmp_path, [160, 0, 70, 900, 70, 0, 0, 0], 500_000)
    assert got[("host", "cpu_util_pct")] == 40.0
    assert got[("cpu0", "cpu_util_pct")] == 40.0
    assert got[("host", "psi_io_some_pct")] == 25.0  # 0.5 s stalled out of 2 s
    assert got[("host", "psi_io_full_pct")] == 12.5
    assert ("host", "psi_cpu_some_pct") not in got  # no /proc/pressure/cpu here
    assert got[("host", "mem_used_bytes")] == 3000 * 1024
    assert got[("host", "mem_shmem_bytes")] == 20 * 1024
    assert got[("host", "steal_pct")] == 0.0


def test_a_vms_stolen_time_is_busy_and_its_own_series(tmp_path: Path) -> None:
    # 200 more jiffies: 60 user busy, 80 idle, 60 stolen by the hypervisor
    got = _sampled_across(tmp_path, [160, 0, 50, 880, 50, 0, 0, 60], 0)
    assert got[("host", "steal_pct")] == 30.0
    assert got[("host", "cpu_util_pct")] == 60.0  # no process here could have had it
    assert ("cpu0", "steal_pct") not in got


@given(st.lists(st.integers(0, 10**12), min_size=8, max_size=10))
def test_parse_proc_stat_busy_never_exceeds_total(ticks: list[int]) -> None:
    times = parse_proc_stat("cpu3 " + " ".join(map(str, ticks)) + "\n")["cpu3"]
    assert 0 <= times.busy <= times.total == sum(ticks[:8])


def test_parse_meminfo_and_pressure() -> None:
    assert parse_meminfo("MemTotal:  2 kB\nHugePages_Free: 3\n") == {
        "MemTotal": 2048, "HugePages_Free": 3}
    assert parse_pressure("some avg10=1.0 total=7\nfull avg10=0 total=3\n") == {
        "some": 7, "full": 3}


def _cgroup_tree(tmp_path: Path, self_cgroup: str) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(self_cgroup)
    return proc, tmp_path / "cgroup"


def test_cpu_quota_v1_takes_the_tightest_ancestor(tmp_path: Path) -> None:
    proc, cg = _cgroup_tree(tmp_path, "2:cpu,cpuacct:/outer/inner\n1:memory:/x\n")
    inner, outer = cg / "cpu,cpuacct" / "outer" / "inner", cg / "cpu,cpuacct" / "outer"
    for d, quota in ((inner, "-1"), (outer, "150000")):
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.cfs_quota_us").write_text(quota + "\n")
        (d / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota_cores(proc=proc, cgroup_root=cg) == 1.5


def test_cpu_quota_v2_and_none(tmp_path: Path) -> None:
    proc, cg = _cgroup_tree(tmp_path, "0::/job\n")
    (cg / "job").mkdir(parents=True)
    (cg / "job" / "cpu.max").write_text("max 100000\n")
    assert cpu_quota_cores(proc=proc, cgroup_root=cg) is None
    (cg / "job" / "cpu.max").write_text("50000 100000\n")
    assert cpu_quota_cores(proc=proc, cgroup_root=cg) == 0.5


def test_real_quota_and_facts() -> None:
    quota = cpu_quota_cores()
    assert quota is None or quota > 0
    facts = env_facts()
    assert facts["env.cpu_count"][0] == cpu_count() >= 1
    assert facts["env.cpu_quota_cores"][0] == quota
