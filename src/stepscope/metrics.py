"""Every series and fact a run records, in one table: (source, metric, unit, meaning).

The samplers and the trainer write these names, the analysis and the report read them, and
``docs/records.md`` documents them; ``tests/test_metrics.py`` checks that every name the code
writes is registered here and that the docs list every registered name. To add a sampler's
series: write it in ``observe/``, register it here, document it in ``docs/records.md``; give
it a :class:`Chart` in ``CHARTS`` and the HTML report draws it (no renderer edit).

Units are in the names (``_s`` seconds, ``_bytes`` bytes, ``_pct`` percent 0-100 where for a
process 100 = one core busy, ``_frac`` 0-1, ``_per_s`` a rate); sources with ``<N>``, ``<pid>``
or ``<dev>`` stand for a family (``cpu0``, ``proc:4711``, ``disk:nvme0n1``).

Like ``policy.py`` this module sits below every layer and imports nothing from stepscope.

Examples:
    >>> metric("host", "cpu_util_pct").unit
    '%'
    >>> metric("gpu1", "util_pct").source
    'gpu<N>'
    >>> fact("stages.phase.3").key
    'stages.phase.<id>'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Chart:
    """Where the HTML report draws a series over time.

    Series with the same ``section`` and ``title`` share one chart (``title`` is its y-axis);
    ``order`` is the series family's place in that chart (series of one order are drawn source
    by source, in ``CHARTS``'s order: ``torch:cuda0`` reserved, allocated, then ``torch:cuda1``);
    ``label`` is the line's legend, where ``{source}`` and a family's placeholders (``{dev}``,
    ``{N}``) take the recorded source's values. A section the report does not know (other than
    cpu, gpu, disk, memory) is drawn under the report's "More series".
    """

    section: str
    title: str
    label: str
    order: int = 0


@dataclass(frozen=True)
class Metric:
    """One series: where it comes from, what it is called, its unit, what it means, and the
    chart the report draws it in (None: not charted over time)."""

    source: str
    metric: str
    unit: str
    meaning: str
    chart: Chart | None = None


@dataclass(frozen=True)
class FactKey:
    """One fact (key -> JSON value, written once or at phase ends)."""

    key: str
    meaning: str


def _m(source: str, unit: str, rows: dict[str, str]) -> list[Metric]:
    return [Metric(source, name, unit if unit != "*" else _unit(name), meaning)
            for name, meaning in rows.items()]


def _unit(name: str) -> str:
    for suffix, unit in (("_bytes_per_s", "B/s"), ("_per_s", "1/s"), ("_bytes", "B"),
                         ("_pct", "%"), ("_frac", "0-1"), ("_s", "s"), ("_w", "W"), ("_c", "°C"),
                         ("_mhz", "MHz")):
        if name.endswith(suffix):
            return unit
    return "count"


_METRICS: tuple[Metric, ...] = tuple(
    _m("host", "*", {
        "cpu_util_pct": "mean over the job's cores",
        "steal_pct": "share of the CPU time the hypervisor ran other guests (a VM's steal)",
        "mem_total_bytes": "/proc/meminfo MemTotal",
        "mem_used_bytes": "MemTotal - MemAvailable",
        "mem_available_bytes": "/proc/meminfo MemAvailable",
        "mem_cached_bytes": "page cache (/proc/meminfo Cached)",
        "mem_shmem_bytes": "shared memory (/dev/shm, DataLoader tensors in transit)",
        "psi_cpu_some_pct": "share of the interval some task waited for a CPU (/proc/pressure)",
        "psi_io_some_pct": "share of the interval some task waited for I/O",
        "psi_io_full_pct": "share of the interval all tasks waited for I/O",
        "psi_mem_some_pct": "share of the interval some task waited for memory",
    })
    + _m("cpu<N>", "*", {"cpu_util_pct": "one core"})
    + _m("proc:<pid>", "*", {
        "cpu_util_pct": "one process (100 = one core)",
        "rss_bytes": "resident set size",
        "uss_bytes": "unique set size (own pages)",
        "read_bytes": "cumulative physical reads (/proc/PID/io read_bytes)",
        "rchar_bytes": "cumulative reads of any kind (/proc/PID/io rchar)",
        "disk_wait": "1 if in state D (waiting for the disk)",
        "running": "1 if in state R",
        "threads": "threads of the process",
    })
    + _m("tree", "*", {
        "cpu_util_pct": "sum over the observed process tree",
        "rss_bytes": "sum over the tree",
        "uss_bytes": "sum over the tree",
        "read_bytes": "cumulative physical reads, reaped children included",
        "rchar_bytes": "cumulative reads of any kind, reaped children included",
        "read_rate_bytes_per_s": "physical reads per second",
        "cache_read_rate_bytes_per_s": "reads served by the page cache per second (rchar - read)",
        "workers": "DataLoader worker processes alive",
    })
    + _m("disk:<dev>", "*", {
        "read_bytes_per_s": "device reads (/proc/diskstats), all processes",
        "write_bytes_per_s": "device writes (/proc/diskstats), all processes",
        "busy_pct": "share of the interval the device had I/O in flight",
    })
    + _m("pagecache", "*", {"dataset_resident_frac": "dataset bytes in the page cache (mincore)"})
    + _m("gpu<N>", "*", {
        "util_pct": "NVML: share of the interval a kernel was running",
        "mem_util_pct": "NVML: share of the interval memory was read or written",
        "mem_used_bytes": "NVML: memory used, all processes",
        "mem_total_bytes": "NVML: memory of the device",
        "pcie_rx_bytes_per_s": "NVML: PCIe receive throughput",
        "pcie_tx_bytes_per_s": "NVML: PCIe transmit throughput",
        "power_w": "NVML: power draw",
        "temp_c": "NVML: temperature",
        "sm_clock_mhz": "NVML: SM clock",
    })
    + _m("gpu<N>:proc:<pid>", "*", {"mem_used_bytes": "NVML: memory used by one process"})
    + _m("torch:cuda<N>", "*", {
        "allocated_bytes": "PyTorch: memory held by tensors",
        "reserved_bytes": "PyTorch: memory held by the caching allocator",
        "inactive_split_bytes": "PyTorch: reserved but unusable (fragmentation)",
        "max_allocated_bytes": "PyTorch: peak allocated",
        "alloc_retries": "PyTorch: allocations that freed the cache and retried",
        "ooms": "PyTorch: out-of-memory errors",
    })
    + _m("trainer", "*", {"checkpoint_write_s": "one checkpoint write, at its time (stepscope "
                                                "train's, or a Keras model.save/save_weights "
                                                "under watch)"})
)


# The series the HTML report charts over time, keyed by (source family, metric). Sections
# "cpu", "gpu", "disk" and "memory" are the report's; their prose lives in render/html.py.
CHARTS: dict[tuple[str, str], Chart] = {
    ("host", "cpu_util_pct"): Chart("cpu", "CPU busy (%)", "all cores (mean)"),
    ("gpu<N>", "util_pct"): Chart("gpu", "GPU utilization (%)", "{source} utilization (NVML)"),
    ("gpu<N>", "mem_util_pct"): Chart("gpu", "GPU utilization (%)",
                                      "{source} memory-bus utilization", 1),
    ("gpu<N>", "mem_used_bytes"): Chart("gpu", "GPU memory", "{source} used (NVML, all processes)"),
    ("torch:cuda<N>", "reserved_bytes"): Chart("gpu", "GPU memory",
                                               "{source} reserved by PyTorch's allocator", 1),
    ("torch:cuda<N>", "allocated_bytes"): Chart("gpu", "GPU memory",
                                                "{source} allocated by tensors", 1),
    ("tree", "read_rate_bytes_per_s"): Chart("disk", "read rate",
                                             "physical reads from disk (training)"),
    ("tree", "cache_read_rate_bytes_per_s"): Chart("disk", "read rate",
                                                   "reads served by the page cache"),
    ("disk:<dev>", "read_bytes_per_s"): Chart("disk", "read rate",
                                              "{dev} device total (all processes)", 1),
    ("pagecache", "dataset_resident_frac"): Chart("disk", "dataset cached (%)",
                                                  "dataset files resident in the page cache"),
    ("host", "mem_used_bytes"): Chart("memory", "memory", "machine: used"),
    ("host", "mem_cached_bytes"): Chart("memory", "memory", "machine: page cache"),
    ("tree", "rss_bytes"): Chart("memory", "memory", "training processes: RSS (shared pages "
                                 "counted per process)", 1),
    ("tree", "uss_bytes"): Chart("memory", "memory", "training processes: USS (own pages)", 1),
}

METRICS: tuple[Metric, ...] = tuple(replace(m, chart=CHARTS.get((m.source, m.metric)))
                                    for m in _METRICS)

FACTS: tuple[FactKey, ...] = tuple(FactKey(k, v) for k, v in {
    "dataset.files": "files of the dataset (train + val)",
    "dataset.bytes": "bytes of the dataset (train + val)",
    "dataset.residency_sample_files": "files checked for page-cache residency",
    "model.name": "the network",
    "model.params": "parameters",
    "model.trainable_params": "trainable parameters",
    "model.file_bytes": "the saved model's size on disk (checkpoint)",
    "model.state_dict_bytes": "the state dict's size as torch.save writes it",
    "mem.weights_bytes": "parameters + buffers",
    "mem.gradients_bytes": ".grad of trainable parameters",
    "mem.optimizer_bytes": "optimizer state tensors (after the first step)",
    "mem.activations_peak_bytes": "tensors saved for backward at a step's peak",
    "mem.input_batch_bytes": "one input batch as it reaches the model",
    "mem.runtime_baseline_bytes": "process memory after the framework started, before the model",
    "mem.pinned_bytes": "pinned host memory (CUDA)",
    "mem.cuda_context_bytes": "NVML per-process used - allocator reserved, at start (GPU)",
    "mem.cuda_step_peak_bytes": "CUDA allocator peak during a training step",
    "mem.forward_transient_bytes": "forward-pass transient peak above what the step keeps",
    "mem.first_step_bytes": "process memory after the first step",
    "mem.step_peak_rise_bytes": "rise of memory over a step, at its peak",
    "mem.model_objects_bytes": "bytes of the framework's model objects (watch)",
    "mem.tf_data_cache_bytes": "a tf.data .cache() held in memory: the images its first pass put in it × their bytes there (watch)",
    "mem.jax_start_bytes": "RSS growth while JAX started at first use: client, MLIR context, first compile (watch)",
    "mem.jax_compiles_bytes": "RSS growth over JAX's XLA compiles between its start and fit(): the eager ops that built the model (watch)",
    "mem.before_loop_bytes": "PyTorch: RSS growth from the framework import to the loop's first "
                             "batch, minus the weights (watch)",
    "mem.tf_allocator_peak_bytes": "TensorFlow allocator peak",
    "mem.jax_bytes_in_use": "JAX device memory in use",
    "mem.jax_peak_bytes": "JAX device memory peak in use (memory_stats peak_bytes_in_use)",
    "mem.tf_gpu_peak_bytes": "TensorFlow GPU allocator peak (get_memory_info peak)",
    "mem.framework": "torch, tensorflow or jax (watch: what the child imported)",
    "env.cpu_count": "CPUs this process may run on (affinity)",
    "run.imports_done": "watch: Unix time each framework's import finished, by framework",
    "run.exception": "watch: the uncaught exception that ended the script (type, message, where)",
    "env.cpu_quota_cores": "cgroup CPU quota in cores (null = none)",
    "env.bf16": "native bf16 on the device",
    "env.cpu_bf16": "native bf16 on this CPU (/proc/cpuinfo flags)",
    "env.device": "where training ran",
    "env.cuda_visible_devices": "CUDA_VISIBLE_DEVICES as the run saw it (GPU identity)",
    "train.precision": "what the trunk ran with (bf16/fp32; a Keras model's compute dtype)",
    "train.channels_last": "memory layout of the trunk",
    "loader.workers": "DataLoader workers the loop used",
    "loader.<figure>": "an input-pipeline figure of the training phase (watch, tf.data)",
    "loader.val_<figure>": "the same figure of the validation phase",
    "loop.framework": "the framework whose loop watch followed",
    "loop.keras_backend": "Keras's backend (tensorflow, jax, torch)",
    "loop.keras_callbacks_timed": "watch timed the user's Keras batch callbacks (other_s)",
    "mem.refit_step_bytes": "Keras: RSS growth over each later fit()'s start and first "
                            "training step (its train function compiled again), summed",
    "model.augment_layers": "Keras: the model's random augmentation layers (class names), read "
                            "at the first fit()",
    "model.trainable_by_fit": "[first epoch, trainable parameters] at each Keras fit() call "
                              "(sent from the second fit on), or at each epoch of a PyTorch "
                              "loop where the count changed",
    "loop.keras_model_checkpoint": "how the ModelCheckpoint given to Model.fit saves "
                                   "({save_best_only, save_weights_only})",
    "loop.keras_gil_wait": "the Keras loop's sleep outside TensorFlow's graph calls is counted "
                           "as data wait (a loading thread pool holds the GIL)",
    "loop.python_gil": "wake-ups of a probe thread while TensorFlow ran a Python op, and how "
                       "many found the GIL held",
    "loop.keras_train_calls": "steady Keras training steps on TensorFlow: wall vs the graph's run",
    "loop.keras_wait_unclocked": "steady Keras/TensorFlow training steps whose data wait was "
                                 "not measured (no step-end clock in their train function)",
    "loop.distribute_strategy": "the tf.distribute strategy a Keras model ran under (class)",
    "loop.distribute_replicas": "replicas in sync of that strategy",
    "loop.tf_eager_train_steps": "training steps of a hand-written TensorFlow loop whose gradients "
                                 "were computed eagerly (outside any tf.function)",
    "featcache.used": "phases served from the trainer's feature cache",
    "monitor.cpu_s": "CPU seconds of stepscope's own sampler and writer threads",
    "watch.no_preallocate": "watch set the TF/JAX memory-growth variables for the child",
    "stages.hooks": "which loader stages watch could time",
    "stages.phase.<id>": "loader stage counters of one phase (written at its end)",
    "stages.seq.<n>": "loader stage counters of one phase, by sequence (watch)",
    "dist.world_size": "ranks of a distributed run",
    "dist.backend": "torch.distributed backend",
    "dist.local_rank": "this rank's index on its node",
    "dist.host": "this rank's node",
    "dist.rank": "this rank, from its process group (watch)",
    "dist.pid": "this rank's process (watch)",
    "dist.node_rank": "this rank's node number, GROUP_RANK or NODE_RANK (watch)",
    "dist.status": "how this rank's process ended: completed, failed, interrupted (watch)",
    "dist.exit_code": "this rank's exit status, 128 + N when killed by signal N (watch)",
    "dist.ended": "when the watch saw this rank's process end",
    "watch.ranks": "ranks that joined a process group under the watched command",
    "watch.rank_pids": "each rank's process under the watched command",
}.items())


def _pattern(name: str) -> re.Pattern[str]:
    # "<N>", "<pid>", "<id>", "<dev>", "<n>" stand for one name segment of a family.
    return re.compile("".join(r"[^:.]+" if part.startswith("<") else re.escape(part)
                              for part in re.split(r"(<[A-Za-z]+>)", name)) + "$")


_METRIC_PATTERNS = [(m, _pattern(m.source)) for m in METRICS]
_FACT_PATTERNS = [(f, _pattern(f.key)) for f in FACTS]


def metric(source: str, name: str) -> Metric:
    """The registered series ``name`` of ``source`` (a concrete source such as ``gpu0``).

    Raises:
        KeyError: nothing of that name is registered for that source.
    """
    for m, pat in _METRIC_PATTERNS:
        if m.metric == name and pat.match(source):
            return m
    raise KeyError(f"{source}/{name} is not in stepscope.metrics.METRICS")


def fact(key: str) -> FactKey:
    """The registered fact ``key`` (a concrete key such as ``stages.phase.3``)."""
    for f, pat in _FACT_PATTERNS:
        if pat.match(key):
            return f
    raise KeyError(f"fact {key} is not in stepscope.metrics.FACTS")


def chart_sources(m: Metric, sources: Iterable[str]) -> list[tuple[str, str]]:
    """The recorded ``sources`` that are of ``m``'s family, with ``m.chart``'s label filled in.

    Examples:
        >>> chart_sources(metric("disk:sda", "read_bytes_per_s"), ["disk:sda", "gpu0", "host"])
        [('disk:sda', 'sda device total (all processes)')]
    """
    if m.chart is None:
        return []
    pat = re.compile("".join(f"(?P<{part[1:-1]}>[^:.]+)" if part.startswith("<")
                             else re.escape(part)
                             for part in re.split(r"(<[A-Za-z]+>)", m.source)) + "$")
    return [(s, m.chart.label.format(source=s, **found.groupdict()))
            for s in sorted(sources) if (found := pat.match(s))]


def metric_names() -> frozenset[str]:
    """Every registered series name, whatever its source."""
    return frozenset(m.metric for m in METRICS)


__all__ = ["CHARTS", "FACTS", "METRICS", "Chart", "FactKey", "Metric", "chart_sources", "fact",
           "metric", "metric_names"]
