"""Verdict and input-cause rules (pure: no store)."""

from __future__ import annotations

import pytest

from stepscope.analysis.causes import is_cold
from stepscope.analysis.verdicts import (
    MIN_STEADY_STEPS,
    InputEvidence,
    decide_input_cause,
    decide_verdict,
)

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_each_verdict_from_the_split() -> None:
    assert decide_verdict(0.62, 0.01, 0.02, 100).verdict == "input-bound"
    assert decide_verdict(0.03, 0.30, 0.02, 100).verdict == "transfer-bound"
    assert decide_verdict(0.03, 0.01, 0.25, 100).verdict == "overhead-bound"
    assert decide_verdict(0.10, 0.05, 0.05, 100).verdict == "compute-bound"


def test_threshold_is_twenty_percent_and_largest_part_wins() -> None:
    assert decide_verdict(0.19, 0.0, 0.0, 100).verdict == "compute-bound"
    assert decide_verdict(0.20, 0.0, 0.0, 100).verdict == "input-bound"
    assert decide_verdict(0.25, 0.0, 0.40, 100).verdict == "overhead-bound"


def test_few_steady_steps_give_a_weak_verdict_with_the_reason() -> None:
    v = decide_verdict(0.62, 0.0, 0.0, MIN_STEADY_STEPS - 1)
    assert v.verdict == "input-bound" and v.weak
    assert v.note is not None and "insufficient steps" in v.note
    assert not decide_verdict(0.62, 0.0, 0.0, MIN_STEADY_STEPS).weak
    none = decide_verdict(None, None, None, 0)
    assert none.verdict is None and none.weak


def test_saturated_workers_mean_cpu() -> None:
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[98.0, 96.0],
                                         host_cpu_pct=70.0))
    assert c.cause == "cpu"
    assert any("98 %" in line for line in c.evidence)


def test_all_cores_busy_mean_cpu_even_with_idle_looking_workers() -> None:
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[60.0, 60.0],
                                         host_cpu_pct=97.0))
    assert c.cause == "cpu" and "all cores busy" in c.evidence[0]


def test_cold_reads_beside_a_saturated_cpu_are_not_the_cause() -> None:
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[97.0, 97.0],
                                         disk_read_bytes=500, rchar_bytes=510,
                                         resident_frac_start=0.0, disk_busy_pct=25.0))
    assert c.cause == "cpu"
    assert any("not the limit" in line for line in c.evidence)


def test_main_process_cpu_when_workers_zero() -> None:
    c = decide_input_cause(InputEvidence(workers=0, main_cpu_pct=99.0, host_cpu_pct=97.0))
    assert c.cause == "cpu" and "workers=0" in c.evidence[0]
    # nothing measured the cores: by elimination, as before
    assert decide_input_cause(InputEvidence(workers=0, main_cpu_pct=99.0)).cause == "cpu"


def test_inline_loading_with_a_measured_spare_core_is_workers() -> None:
    """workers=0, the training process saturated by its own loading, half the job's cores idle:
    worker processes would load on them, so 'more workers cannot help' would be wrong."""
    c = decide_input_cause(InputEvidence(workers=0, main_cpu_pct=99.0, host_cpu_pct=55.0))
    assert c.cause == "workers", c.evidence
    assert "host CPU 55 % (cores to spare)" in c.evidence
    c = decide_input_cause(InputEvidence(workers=0, main_cpu_pct=99.0, job_cpu_pct=52.0,
                                         host_cpu_pct=97.0))  # others keep the host busy
    assert c.cause == "workers" and "the job used 52 % of its cores (cores to spare)" in c.evidence


def test_storage_when_reads_are_cold_and_loaders_stall() -> None:
    c = decide_input_cause(InputEvidence(
        workers=2, worker_cpu_pct=[15.0, 12.0], host_cpu_pct=20.0, disk_read_bytes=400_000_000,
        rchar_bytes=410_000_000, resident_frac_start=0.0, psi_io_some_pct=45.0, disk_wait_frac=0.6))
    assert c.cause == "storage"
    text = " ".join(c.evidence)
    assert "physical reads" in text and "pressure" in text and "disk wait" in text


def test_workers_when_cached_reads_and_idle_cores() -> None:
    c = decide_input_cause(InputEvidence(
        workers=1, worker_cpu_pct=[60.0], host_cpu_pct=45.0, disk_read_bytes=0,
        rchar_bytes=500_000_000, resident_frac_start=1.0))
    assert c.cause == "workers"
    assert any("page cache" in line for line in c.evidence)


def test_busy_cores_beside_loaders_in_disk_wait_are_not_called_spare() -> None:
    """Workers asleep on the disk (not the CPU's limit) on a job whose cores others keep busy,
    with nothing read cold: the cause is not storage (no cold reads) nor CPU (the loaders sleep),
    and the job's figure is named without claiming cores to spare."""
    for busy in (dict(job_cpu_pct=95.0), dict(host_cpu_pct=97.0)):
        c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[20.0, 25.0],
                                             disk_wait_frac=0.5, **busy))
        text = " ".join(c.evidence)
        assert c.cause == "workers", c.evidence
        assert "to spare" not in text and ("95 %" in text or "97 %" in text), c.evidence
        assert "disk wait in 50 %" in text
    # the same loaders with the job's cores half idle: to spare, as before
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[20.0, 25.0],
                                         disk_wait_frac=0.5, job_cpu_pct=50.0))
    assert "the job used 50 % of its cores (cores to spare)" in c.evidence


def test_storage_needs_a_stall_not_only_cold_reads() -> None:
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[70.0, 70.0],
                                         host_cpu_pct=60.0, disk_read_bytes=400_000_000,
                                         rchar_bytes=400_000_000, resident_frac_start=0.0))
    assert c.cause == "workers"


def test_physical_reads_below_the_byte_floor_are_not_a_cold_cache() -> None:
    # 12 MB of shared libraries paged in by new workers against 415 kB of files read.
    small = InputEvidence(workers=2, worker_cpu_pct=[15.0, 12.0], disk_read_bytes=12_000_000,
                          rchar_bytes=415_000, psi_io_some_pct=45.0)
    assert "physical reads" not in " ".join(decide_input_cause(small).evidence)
    big = InputEvidence(workers=2, worker_cpu_pct=[15.0, 12.0], disk_read_bytes=120_000_000,
                        rchar_bytes=125_000_000, psi_io_some_pct=45.0)
    assert "physical reads" in " ".join(decide_input_cause(big).evidence)


def test_physical_reads_beside_a_resident_dataset_are_not_a_cold_cache() -> None:
    """120 MB paged in (libraries, a mapped file) while the dataset stayed in the page cache
    from the phase's start to its end: not the dataset's reads, so no cold cache and no
    storage cause, however the loaders stall."""
    kw = dict(workers=2, worker_cpu_pct=[15.0, 12.0], disk_read_bytes=120_000_000,
              rchar_bytes=125_000_000, psi_io_some_pct=45.0, disk_wait_frac=0.6,
              resident_frac_start=1.0)
    assert decide_input_cause(InputEvidence(**kw)).cause == "storage"  # the end not measured
    c = decide_input_cause(InputEvidence(**kw, resident_frac_end=0.97))
    assert c.cause == "workers" and "physical reads" not in " ".join(c.evidence), c.evidence
    assert not is_cold(InputEvidence(**kw, resident_frac_end=0.97))


def test_not_saturated_rests_on_worker_samples() -> None:
    sampled = decide_input_cause(InputEvidence(workers=3, worker_cpu_pct=[20.0, 20.0, 20.0]))
    assert sampled.evidence[0] == "3 DataLoader workers, not saturated"
    keras = decide_input_cause(InputEvidence(workers=1, worker_word="loading worker"))
    assert keras.evidence[0] == "1 loading worker, its CPU not sampled"
    unsampled = decide_input_cause(InputEvidence(workers=3))
    assert "not saturated" not in " ".join(unsampled.evidence)


def test_never_input_bound_while_the_gpu_is_busy() -> None:
    from stepscope.analysis.verdicts import Verdict, gpu_cross_check

    waited = Verdict("input-bound", False, None)
    busy = gpu_cross_check(waited, 96.0)
    assert busy.verdict == "compute-bound" and busy.weak and "96 %" in (busy.note or "")
    assert gpu_cross_check(waited, 60.0) == waited
    assert gpu_cross_check(waited, None) == waited  # no GPU measured: the split decides


def test_a_vms_steal_is_not_a_core_to_spare() -> None:
    # Two loader processes burning CPU on a 2-core VM whose hypervisor ran other guests 30 %
    # of the time: each reads ~66 % of a core and the job ~68 % of its cores, all it could get.
    ev = InputEvidence(workers=2, worker_cpu_pct=[66.0, 67.0], job_cpu_pct=68.0, steal_pct=30.0)
    c = decide_input_cause(ev)
    assert c.cause == "cpu", c.evidence
    assert "2 workers at 66 %, 67 % of a core (the hypervisor ran other guests 30 % of this " \
           "VM's CPU time: steal)" in c.evidence[0].replace("DataLoader workers", "workers")
    # The same figures without the steal series: cores to spare, and no word of a hypervisor.
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[66.0, 67.0],
                                         job_cpu_pct=68.0))
    assert c.cause == "workers" and "hypervisor" not in " ".join(c.evidence)
    # A little steal changes nothing and is not named.
    c = decide_input_cause(InputEvidence(workers=2, worker_cpu_pct=[66.0, 67.0],
                                         job_cpu_pct=68.0, steal_pct=2.0))
    assert c.cause == "workers" and "hypervisor" not in " ".join(c.evidence)


def test_a_worker_on_each_core_with_the_cores_mostly_busy_is_cpu() -> None:
    """A tf.data map at AUTOTUNE (a worker per core) whose job read 86 % of its cores: more
    workers would share the same cores, so ``cpu``, with the figures; one worker short of the
    cores, or the cores half idle, stays ``workers``; without the job's CPU it cannot be said."""
    at_cores = InputEvidence(workers=2, job_cores=2, job_cpu_pct=86.0,
                             worker_word="tf.data parallel call")
    found = decide_input_cause(at_cores)
    assert found.cause == "cpu", found
    assert found.evidence[0] == ("2 tf.data parallel calls already, one for each of the job's 2 "
                                 "cores (the job used 86 % of them): more would share the same "
                                 "cores"), found
    assert decide_input_cause(InputEvidence(workers=1, job_cores=2, job_cpu_pct=86.0)
                              ).cause == "workers"
    assert decide_input_cause(InputEvidence(workers=2, job_cores=2, job_cpu_pct=50.0)
                              ).cause == "workers"
    unmeasured = decide_input_cause(InputEvidence(workers=2, job_cores=2))
    assert unmeasured.cause == "workers" and "already" not in " ".join(unmeasured.evidence)
