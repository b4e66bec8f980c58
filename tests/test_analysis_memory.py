"""The memory ledger adds up: items + unattributed == the measured total."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from stepscope.analysis.contracts_summary import Summary
from stepscope.analysis.explain import memory_answer
from stepscope.analysis.memory import detect_pool, footprint_line
from stepscope.analysis.samples import SampleCache
from stepscope.analysis.summary import build_summary
from stepscope.render.html import _ledger as html_ledger
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import ProcessInfo, RunInfo, Sample
from tests.analysis_runs import CPU_FACTS, MAIN_PID, T0, PhaseSpec, RunSpec, make_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _summary(tmp_path: Path, run: RunSpec) -> dict[str, Any]:
    make_run(tmp_path, run)
    with RunReader(tmp_path) as r:
        return build_summary(r)


def _adds_up(mem: dict[str, Any]) -> None:
    assert sum(i["bytes"] for i in mem["ledger"]) + mem["unattributed_bytes"] == mem["total_bytes"]
    assert all(i["how_measured"] for i in mem["ledger"])


def test_cpu_ledger_adds_up_and_names_each_worker(tmp_path: Path) -> None:
    s = _summary(tmp_path, RunSpec([PhaseSpec(1, workers=2), PhaseSpec(1, "val", workers=2)],
                                   facts=dict(CPU_FACTS)))
    mem = s["memory"]
    assert mem["device"] == "cpu"
    _adds_up(mem)
    items = {i["item"]: i["bytes"] for i in mem["ledger"]}
    assert items["weights"] == 14_000_000
    assert items["saved for backward"] == 180_000_000
    assert items["framework/runtime baseline"] == 1_100_000_000
    assert items["shared memory for batches"] == 30_000_000
    workers = [k for k in items if k.startswith("DataLoader worker")]
    assert len(workers) == 2  # only the workers alive at the peak, not every epoch's
    assert mem["total_bytes"] == pytest.approx(mem["main_rss_bytes"] + 2e8, abs=1)
    assert 0 <= mem["unattributed_frac"] <= 0.10
    assert mem["footprint_line"] == "14 MB model, 1.6 GB used"


def test_memory_after_the_last_phase_is_noted_not_ledgered(tmp_path: Path) -> None:
    # Interpreter teardown after training (seen under watch: +80 MB of RSS a second after a
    # Lightning fit returned) is not training's memory: the ledger is the phases' peak, and the
    # higher RSS outside them is named in a note with the samples it rests on.
    phases = [PhaseSpec(1, workers=2), PhaseSpec(1, "val", workers=2)]
    plain = _summary(tmp_path / "plain", RunSpec(phases, facts=dict(CPU_FACTS)))["memory"]
    spike = [Sample(T0 + 25, f"proc:{MAIN_PID}", "rss_bytes", 3e9)]
    mem = _summary(tmp_path / "spike", RunSpec(phases, facts=dict(CPU_FACTS),
                                               extra_samples=spike))["memory"]
    _adds_up(mem)
    assert mem["total_bytes"] == plain["total_bytes"]
    assert mem["unattributed_frac"] == plain["unattributed_frac"]
    assert not any("outside" in n or "after the last phase" in n for n in plain["notes"])
    note = [n for n in mem["notes"] if "after the last phase" in n]
    assert note and "3.0 GB" in note[0] and "main-process RSS samples" in note[0]


def test_gpu_ledger_with_torch_allocator_adds_up(tmp_path: Path) -> None:
    facts = dict(CPU_FACTS, **{"mem.cuda_context_bytes": 400_000_000,
                               "mem.activations_peak_bytes": 900_000_000})
    run = RunSpec([PhaseSpec(1, gpu_util_pct=80)], facts=facts, device="cuda:0",
                  gpu_proc_used_bytes=2.5e9, torch_reserved_bytes=2.0e9,
                  torch_max_allocated_bytes=1.2e9)
    mem = _summary(tmp_path, run)["memory"]
    assert mem["device"] == "cuda:0" and mem["total_bytes"] == 2_500_000_000
    _adds_up(mem)
    items = {i["item"]: i["bytes"] for i in mem["ledger"]}
    assert items["CUDA context"] == 400_000_000
    assert items["cached but free"] == 800_000_000
    named = sum(items[k] for k in ("weights", "gradients", "optimizer state",
                                   "saved for backward", "input batch"))
    assert items["other tensors at the allocation peak"] == 1_200_000_000 - named
    assert mem["unattributed_bytes"] == 100_000_000  # outside context + reserved
    assert mem["unattributed_frac"] <= 0.05
    assert mem["preallocated_pool"] is None


def test_gpu_run_host_ledger_leaves_device_tensors_to_the_gpu_ledger(tmp_path: Path) -> None:
    facts = dict(CPU_FACTS, **{"mem.cuda_context_bytes": 400_000_000,
                               "mem.activations_peak_bytes": 900_000_000,
                               "mem.cuda_step_peak_bytes": 1_000_000_000})
    run = RunSpec([PhaseSpec(1, gpu_util_pct=80)], facts=facts, device="cuda:0",
                  gpu_proc_used_bytes=2.5e9, torch_reserved_bytes=2.0e9,
                  torch_max_allocated_bytes=1.2e9)
    s = _summary(tmp_path, run)
    host = {i["item"] for i in s["host_memory"]["ledger"]}
    assert not host & {"weights", "gradients", "optimizer state", "saved for backward"}
    gpu = {i["item"]: i["bytes"] for i in s["memory"]["ledger"]}
    assert gpu["weights"] == 14_000_000
    left = gpu["saved for backward"] + gpu["gradients"] + gpu["optimizer state"]
    assert gpu["forward transient peak"] == 1_000_000_000 - left
    _adds_up(s["memory"])


def test_gpu_ledger_names_a_tensorflow_preallocated_pool(tmp_path: Path) -> None:
    facts = {"mem.framework": "tensorflow", "mem.cuda_context_bytes": 300_000_000,
             "model.file_bytes": 549_000_000}
    run = RunSpec([PhaseSpec(1, gpu_util_pct=30)], facts=facts, device="cuda:0",
                  gpu_proc_used_bytes=6.5e9, gpu_total_bytes=8e9)
    s = _summary(tmp_path, run)
    mem = s["memory"]
    _adds_up(mem)
    assert mem["unattributed_bytes"] == 0
    pool = mem["preallocated_pool"]
    assert pool["framework"] == "tensorflow" and pool["pool_bytes"] == 6_500_000_000
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in pool["fix"]
    assert "--no-preallocate" in pool["fix"]
    assert mem["footprint_line"] == "549 MB model, 6.5 GB used"
    assert s["host_memory"]["device"] == "cpu"
    assert any(f["id"] == "gpu_preallocated_pool" for f in s["findings"])


def test_gpu_pool_split_by_the_tensorflow_allocator_peak(tmp_path: Path) -> None:
    facts = {"mem.framework": "tensorflow", "mem.cuda_context_bytes": 300_000_000,
             "mem.tf_gpu_peak_bytes": 1_200_000_000}
    run = RunSpec([PhaseSpec(1, gpu_util_pct=30)], facts=facts, device="cuda:0",
                  gpu_proc_used_bytes=6.5e9, gpu_total_bytes=8e9)
    mem = _summary(tmp_path, run)["memory"]
    _adds_up(mem)
    items = {i["item"]: i["bytes"] for i in mem["ledger"]}
    assert items["tensorflow tensors at their peak"] == 1_200_000_000
    assert items["preallocated pool, never used"] == 6_500_000_000 - 300_000_000 - 1_200_000_000


def test_pool_detection_by_framework_or_card_share() -> None:
    jax = detect_pool("jax", 6e9, 8e9)
    assert jax is not None and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in jax["fix"]
    unknown = detect_pool(None, 7.5e9, 8e9)
    assert unknown is not None
    assert detect_pool("torch", 2e9, 8e9) is None
    assert detect_pool(None, 2e9, 8e9) is None


def test_missing_memory_samples_give_an_unknown_total_with_a_note(tmp_path: Path) -> None:
    run = RunSpec([PhaseSpec(1)], device="cuda:0")
    mem = _summary(tmp_path, run)["memory"]
    assert mem["total_bytes"] is None and mem["unattributed_bytes"] is None
    assert mem["notes"]


def test_footprint_line() -> None:
    assert footprint_line(549_000_000, 6_500_000_000) == "549 MB model, 6.5 GB used"
    assert footprint_line(None, 1) is None


def test_gpu_busy_phase_is_not_called_input_bound(tmp_path: Path) -> None:
    # The CPU waited 70 % of each step, but NVML saw kernels 95 % of the time: the wait
    # overlapped queued GPU work (analysis/verdicts.gpu_cross_check).
    run = RunSpec([PhaseSpec(1, data_wait_s=0.18, compute_s=0.07, gpu_util_pct=95)],
                  device="cuda:0", gpu_proc_used_bytes=2.5e9)
    s = _summary(tmp_path, run)
    assert s["phases"][0]["verdict"] == "compute-bound"
    assert s["by_phase"]["train"]["verdict"] == "compute-bound"
    assert "95 %" in s["by_phase"]["train"]["verdict_note"]


def test_a_reused_run_folder_ledgers_the_newest_attempt(tmp_path: Path) -> None:
    # `watch --out DIR` on a folder that already held an attempt (here one that failed at
    # start-up, 15 MB of RSS) appends to its store: two `main` processes. The facts are the
    # newest attempt's, so its process is the total's (the first main gave -5145 %).
    stale = RunWriter(tmp_path, RunInfo(name="test", command="pytest", started=T0 - 30, pid=40))
    stale.put_process(ProcessInfo(41, 40, "main", "python", T0 - 30, T0 - 29))
    stale.add_samples([Sample(T0 - 29.5, "proc:41", "rss_bytes", 15e6)])
    stale.close("failed", 1)
    mem = _summary(tmp_path, RunSpec([PhaseSpec(1)], facts=dict(CPU_FACTS)))["memory"]
    _adds_up(mem)
    assert mem["main_rss_bytes"] > 1e9
    assert 0 <= mem["unattributed_frac"] <= 0.10


# A long run: its first minutes are kept only as 60-s roll-ups (mean, lowest, highest) once the
# run is longer than the store's raw window. T0 on a slice boundary, so minute 3 is one slice.
LONG_T0 = 60_000.0
LONG_S = 1_800  # 30 minutes at 1 Hz: the raw window (15 min) keeps only the second half


def _long_run(run_dir: Path) -> None:
    """Flat memory with spikes planted in the rolled-up part: main RSS 10 GB for 2 s at minute
    3, worker 1000's USS 500 MB for 1 s 20 s later (same slice, not the same instant), GPU
    used 9 GB (reserved 8 GB, max allocated 7 GB) for 1 s at minute 5."""
    w = RunWriter(run_dir, RunInfo(name="long", command="pytest", device="cuda:0",
                                   started=LONG_T0, pid=100), clock=lambda: LONG_T0 + LONG_S)
    w.put_process(ProcessInfo(100, 1, "main", "python", LONG_T0, LONG_T0 + LONG_S))
    for pid in (1000, 1001):
        w.put_process(ProcessInfo(pid, 100, "worker", "pt_data_worker", LONG_T0, LONG_T0 + LONG_S))
    for k in range(0, LONG_S, 300):
        out = []
        for s in range(k, k + 300):
            t = LONG_T0 + s
            out += [Sample(t, "proc:100", "rss_bytes", 10e9 if 180 <= s <= 181 else 1e9),
                    Sample(t, "tree", "rss_bytes", 11e9 if s == 180 else 1.2e9),
                    Sample(t, "proc:1000", "uss_bytes", 5e8 if s == 200 else 1e8),
                    Sample(t, "proc:1001", "uss_bytes", 1e8),
                    Sample(t, "host", "mem_shmem_bytes", 2e8 if s == 185 else 5e7),
                    Sample(t, "gpu0", "mem_total_bytes", 24e9),
                    Sample(t, "gpu0:proc:100", "mem_used_bytes", 9e9 if s == 300 else 2e9),
                    Sample(t, "torch:cuda0", "reserved_bytes", 8e9 if s == 300 else 1.5e9),
                    Sample(t, "torch:cuda0", "max_allocated_bytes", 7e9 if s >= 300 else 1e9)]
        w.add_samples(out)
        w.flush()
    w.close("completed")


def test_a_spike_in_the_rolled_up_part_of_a_long_run_is_the_peak(tmp_path: Path) -> None:
    _long_run(tmp_path)
    with RunReader(tmp_path) as r:
        # The planted spikes are rolled up: read as the slice's mean, they vanish.
        _, mean = r.series("rss_bytes", "proc:100")
        assert max(mean) < 1.5e9
        s = build_summary(r)
    host = s["host_memory"]
    _adds_up(host)
    assert host["main_rss_bytes"] == 10_000_000_000
    # Main RSS's and each worker's highest of the slice, summed: an upper bound, said so.
    assert host["total_bytes"] == 10_000_000_000 + 500_000_000 + 100_000_000
    assert host["total_upper_bound"] is True
    assert LONG_T0 + 180 <= host["peak_t"] < LONG_T0 + 240
    assert any("upper bound" in n for n in host["notes"])
    items = {i["item"]: i for i in host["ledger"]}
    workers = [i for k, i in items.items() if k.startswith("DataLoader worker")]
    assert sorted(i["bytes"] for i in workers) == [100_000_000, 500_000_000]
    assert all("highest USS" in i["how_measured"] and "60-s roll-up slice" in i["how_measured"]
               for i in workers)
    assert items["shared memory for batches"]["bytes"] == 150_000_000
    assert "highest host Shmem" in items["shared memory for batches"]["how_measured"]
    assert s["system"]["tree_rss_max_bytes"] == 11e9
    gpu = s["memory"]
    _adds_up(gpu)
    assert gpu["total_bytes"] == 9_000_000_000  # one process: its slice's highest, exact
    assert "total_upper_bound" not in gpu
    gitems = {i["item"]: i for i in gpu["ledger"]}
    assert gitems["cached but free"]["bytes"] == 1_000_000_000
    assert "highest allocator reserved" in gitems["cached but free"]["how_measured"]
    answer = memory_answer(s)
    assert answer is not None
    assert "at its peak: 9.0 GB" in answer[1]  # the GPU total is exact: one process
    assert "On the host: at most (each process's highest sample" in answer[1]
    _, body = html_ledger(cast(Summary, {"memory": host}))
    assert "at most: each process&#x27;s highest sample" in "".join(map(str, body))
    assert "the total adds each process's highest of the slice: an upper bound" in \
        workers[0]["how_measured"]


def test_a_raw_only_run_reads_every_peak_as_before(tmp_path: Path) -> None:
    # No roll-up: each point is its own mean and highest, so the peak series is the same one
    # and no ledger text speaks of slices or bounds.
    s = _summary(tmp_path, RunSpec([PhaseSpec(1, workers=2)], facts=dict(CPU_FACTS),
                                   device="cuda:0", gpu_proc_used_bytes=2.5e9,
                                   torch_reserved_bytes=2.0e9, torch_max_allocated_bytes=1.2e9))
    for mem in (s["memory"], s["host_memory"]):
        assert "total_upper_bound" not in mem
        assert not any("slice" in i["how_measured"] for i in mem["ledger"])
        assert not any("upper bound" in n for n in mem["notes"])
    _, body = html_ledger(s)
    assert "what the device reports in use" in "".join(map(str, body))
    hows = {i["item"]: i["how_measured"] for i in s["host_memory"]["ledger"]}
    assert hows["DataLoader worker 1"] == "USS of worker pid 1000 (smaps_rollup)"
    with RunReader(tmp_path) as r:
        cache = SampleCache(r)
        mean = cache.get("proc:100", "rss_bytes")
        assert cache.peak("proc:100", "rss_bytes") is mean
        assert r.series("rss_bytes", "proc:100", stat="max") == (mean.t, mean.v)
