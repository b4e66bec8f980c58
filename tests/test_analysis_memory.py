"""The memory ledger adds up: items + unattributed == the measured total."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.memory import detect_pool, footprint_line
from stepscope.analysis.summary import build_summary
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import ProcessInfo, RunInfo, Sample
from tests.analysis_runs import CPU_FACTS, T0, PhaseSpec, RunSpec, make_run

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
