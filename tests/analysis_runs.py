"""Hand-made runs for the analysis tests: real records written with a real RunWriter.

Each ``PhaseSpec`` becomes one phase row, its steps (identical split each step) and samples every
0.5 s inside its window: host CPU, the main process, one ``proc:<pid>`` per worker, pressure,
disk, page cache and (optionally) the GPU. Workers are new processes in every phase, as with a
non-persistent DataLoader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.store.db import RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord
from tests.conftest import LANE2_WAIT_S

T0 = 1_000.0
MAIN_PID = 100
SAMPLE_EVERY_S = 0.5


@dataclass
class PhaseSpec:
    epoch: int
    phase: str = "train"
    steps: int = 40
    warmup: int = 2
    images_per_step: int = 8
    data_wait_s: float = 0.05
    transfer_s: float = 0.001
    compute_s: float = 0.2
    other_s: float = 0.004
    workers: int = 2
    worker_cpu_pct: float = 50.0
    main_cpu_pct: float = 60.0
    host_cpu_pct: float = 60.0
    read_bytes: int = 0
    rchar_bytes: int = 100_000_000
    resident_start: float | None = 1.0
    resident_end: float | None = 1.0
    psi_io_pct: float = 0.0
    disk_wait: float = 0.0
    disk_busy_pct: float = 1.0
    gpu_util_pct: float | None = None
    checkpoint_s: float | None = None
    rank: int = 0

    @property
    def wall_s(self) -> float:
        return self.data_wait_s + self.transfer_s + self.compute_s + self.other_s


@dataclass
class RunSpec:
    phases: list[PhaseSpec]
    facts: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    main_rss_bytes: float = 1.45e9
    worker_uss_bytes: float = 1.0e8
    shmem_growth_bytes: float = 3.0e7
    extra_samples: list[Sample] = field(default_factory=list)
    gpu_proc_used_bytes: float | None = None
    gpu_total_bytes: float = 24e9
    torch_reserved_bytes: float | None = None
    torch_max_allocated_bytes: float | None = None
    config: dict[str, Any] = field(default_factory=dict)  # the run's resolved config
    status: str = "completed"
    exit_code: int | None = None


def _samples_for(spec: PhaseSpec, t0: float, t1: float, worker_pids: list[int],
                 run: RunSpec) -> list[Sample]:
    out: list[Sample] = []
    t = t0 + 0.01
    while t < t1:
        frac = (t - t0) / (t1 - t0)
        out += [Sample(t, "host", "cpu_util_pct", spec.host_cpu_pct),
                Sample(t, "host", "psi_io_some_pct", spec.psi_io_pct),
                Sample(t, "host", "mem_total_bytes", 16e9),
                Sample(t, "host", "mem_available_bytes", 10e9),
                Sample(t, "host", "mem_shmem_bytes", 5e7 + run.shmem_growth_bytes * (t > T0 + 1)),
                Sample(t, f"proc:{MAIN_PID}", "cpu_util_pct", spec.main_cpu_pct),
                Sample(t, f"proc:{MAIN_PID}", "rss_bytes", run.main_rss_bytes * (0.9 + 0.1 * frac)),
                Sample(t, f"proc:{MAIN_PID}", "disk_wait", spec.disk_wait if not worker_pids else 0),
                Sample(t, "tree", "rss_bytes", run.main_rss_bytes),
                Sample(t, "disk:sda", "busy_pct", spec.disk_busy_pct)]
        for pid in worker_pids:
            out += [Sample(t, f"proc:{pid}", "cpu_util_pct", spec.worker_cpu_pct),
                     Sample(t, f"proc:{pid}", "uss_bytes", run.worker_uss_bytes),
                     Sample(t, f"proc:{pid}", "disk_wait", spec.disk_wait)]
        if spec.gpu_util_pct is not None:
            out.append(Sample(t, "gpu0", "util_pct", spec.gpu_util_pct))
            out.append(Sample(t, "gpu0", "mem_total_bytes", run.gpu_total_bytes))
        if run.gpu_proc_used_bytes is not None:
            out.append(Sample(t, f"gpu0:proc:{MAIN_PID}", "mem_used_bytes", run.gpu_proc_used_bytes))
        if run.torch_reserved_bytes is not None:
            out.append(Sample(t, "torch:cuda0", "reserved_bytes", run.torch_reserved_bytes))
            out.append(Sample(t, "torch:cuda0", "max_allocated_bytes",
                              run.torch_max_allocated_bytes or 0.0))
        t += SAMPLE_EVERY_S
    return out


def make_run(run_dir: Path, run: RunSpec, name: str = "test") -> Path:
    """Write the run into ``run_dir/run.db`` and return ``run_dir``."""
    t = T0
    end_holder = [T0]
    w = RunWriter(run_dir, RunInfo(name=name, command="pytest", device=run.device,
                                   started=T0, pid=MAIN_PID, config=run.config),
                  clock=lambda: end_holder[0])
    w.put_process(ProcessInfo(MAIN_PID, 1, "main", "python", T0, T0 + 1e6))
    read_total, rchar_total, next_pid = 0, 0, 1000
    for pid_n, spec in enumerate(run.phases):
        t1 = t + spec.steps * spec.wall_s
        worker_pids = list(range(next_pid, next_pid + spec.workers))
        next_pid += spec.workers
        for pid in worker_pids:
            w.put_process(ProcessInfo(pid, MAIN_PID, "worker", "pt_data_worker", t, t1))
        w.put_phase(PhaseRecord(
            phase_id=pid_n, epoch=spec.epoch, phase=spec.phase, started=t, ended=t1,
            steps=spec.steps, images=spec.steps * spec.images_per_step,
            resident_frac_start=spec.resident_start, resident_frac_end=spec.resident_end,
            read_bytes_start=read_total, read_bytes_end=read_total + spec.read_bytes,
            rchar_start=rchar_total, rchar_end=rchar_total + spec.rchar_bytes,
            workers=spec.workers, rank=spec.rank))
        read_total += spec.read_bytes
        rchar_total += spec.rchar_bytes
        for i in range(spec.steps):
            w.add_step(StepRecord(
                phase_id=pid_n, step=i, t_start=t + i * spec.wall_s, wall_s=spec.wall_s,
                data_wait_s=spec.data_wait_s, transfer_s=spec.transfer_s,
                compute_s=spec.compute_s, other_s=spec.other_s,
                images=spec.images_per_step, warmup=i < spec.warmup))
        w.add_samples(_samples_for(spec, t, t1, worker_pids, run))
        if spec.checkpoint_s is not None:
            # at the write's end, as the trainer and watch record it (after the save returns)
            w.add_samples([Sample(t1 + spec.checkpoint_s, "trainer", "checkpoint_write_s",
                                  spec.checkpoint_s)])
        t = t1 + (spec.checkpoint_s or 0.0)
    w.add_samples(run.extra_samples)
    for key, value in run.facts.items():
        w.fact(key, value, f"test fact {key}")
    end_holder[0] = t
    w.close(run.status, run.exit_code, timeout_s=LANE2_WAIT_S)  # readers assert on every row
    return run_dir


CPU_FACTS: dict[str, Any] = {
    "env.cpu_count": 2,
    "dataset.files": 2000, "dataset.bytes": 550_000_000,
    "model.name": "efficientnet_lite0", "model.params": 3_400_000,
    "model.trainable_params": 1281, "model.file_bytes": 14_000_000,
    "mem.weights_bytes": 14_000_000, "mem.gradients_bytes": 5_124,
    "mem.optimizer_bytes": 10_248, "mem.activations_peak_bytes": 180_000_000,
    "mem.input_batch_bytes": 8 * 3 * 299 * 299 * 4,
    "mem.runtime_baseline_bytes": 1_100_000_000, "mem.framework": "torch",
}
