"""Typed contracts for ``summary.json``: phase rows, by-phase aggregates, ranks, memory, run.

Like ``analysis/contracts.py`` (findings, ledger items) these are ``TypedDict``s: a summary is
still the plain JSON-ready dict DESIGN.md specifies, serialised unchanged (schema_version 1),
while mypy checks every key the analysis writes and compare, explain and the renderers read
back. Keys a section always carries are required; the optional ones (``total=False`` bases)
are those the analysis adds only for some runs (a rank table from arrival records, a GPU
ledger, a feature-cached phase) — each base says when.
"""

from __future__ import annotations

from typing import TypedDict

from stepscope.analysis.contracts import Finding, LedgerItem


class StepSplitFields(TypedDict):
    """The step split as summary keys (``analysis.phases.split_fields``): shares of the steady
    steps' wall time, ms per step and ms per image; None without steady steps."""

    data_wait_frac: float | None
    transfer_frac: float | None
    compute_frac: float | None  # compute + all-reduce (comm is inside backward)
    comm_frac: float | None
    other_frac: float | None
    outlier_steps: int
    outlier_s: float
    step_ms_per_step: float | None
    data_wait_ms_per_step: float | None
    transfer_ms_per_step: float | None
    compute_ms_per_step: float | None
    other_ms_per_step: float | None
    data_wait_ms_per_image: float | None
    compute_ms_per_image: float | None
    step_ms_per_image: float | None


class LoaderRow(TypedDict):
    """``phase["loader"]``: the input pipeline's own timing (where its stages were measured)."""

    workers: int
    persistent_workers: bool | None
    items: float
    stage_ms_per_image: dict[str, float] | None
    read_bytes_per_image: float | None
    worker_busy_s: list[float]
    worker_busy_frac: float | None
    not_ready_frac: float | None
    first_wait_s: float | None
    startup_s: float
    wait_cpu_frac: float | None
    fetch_on_cpu_frac: float | None
    fetch_runq_frac: float | None
    fetch_blocked_frac: float | None
    worker_threads: bool  # the workers are threads of the training process (Keras PyDataset)
    worker_cpu_s: list[float]  # each worker's on-CPU seconds inside batches (beside busy_s)
    threads_gil_bound: bool | None  # None: not threads; see analysis/capacity.ThreadFigures
    processes_prediction: PredictionRow | None  # use_multiprocessing=True, where it would gain


class CapacityRow(TypedDict):
    """``phase["capacity"]``: ``analysis.capacity.Capacity`` as plain data (images/s, cores)."""

    now_images_per_s: float
    consume_images_per_s: float | None
    per_loader_images_per_s: float | None
    loader_images_per_s: float | None
    storage_images_per_s: float | None
    cpu_s_per_image: float | None
    runq_s_per_image: float
    job_cores: float | None
    obtainable_cores: float | None
    compute_cores: float | None
    spare_cores: float | None
    model_cpu_s_per_image: float | None
    cpu_images_per_s: float | None
    binding: str | None
    stage_ms_per_image: dict[str, float]
    steal_frac: float


class _PredictionCore(TypedDict):
    change: str
    images_per_s: float
    speedup: float
    basis: str


class PredictionRow(_PredictionCore, total=False):
    """One of ``phase["predictions"]``: a priced fix; ``workers`` only for a worker count."""

    workers: int


class LoaderStages(TypedDict):
    """``phase["loader_stages"]``: an ImageDataGenerator's stages (Keras under watch)."""

    images: int
    batches: int
    ms_per_image: dict[str, float]
    thread_busy_s: list[float]
    thread_busy_frac: list[float]


class _PhaseCore(StepSplitFields):
    phase_id: int
    epoch: int
    phase: str  # train | val
    rank: int | None
    started: float
    ended: float
    steps: int
    steady_steps: int
    warmup_steps: int
    warmup_s: float  # the warm-up steps' wall time (first steps: tracing, compiling, start-up)
    images: int
    seconds: float
    images_per_s: float | None
    verdict: str | None
    verdict_weak: bool
    verdict_note: str | None
    input_cause: str | None
    input_evidence: list[str]
    disk_read_bytes: int | None
    cache_read_bytes: int | None
    rchar_bytes: int | None
    disk_read_rate_bytes_per_s: float | None
    dataset_resident_frac_start: float | None
    dataset_resident_frac_end: float | None
    cpu_util_pct: float | None
    cpu_util_max_pct: float | None
    steal_pct: float | None  # a VM's CPU time the hypervisor gave other guests (None: not one)
    job_cpu_pct: float | None  # the process tree's CPU, % of the job's cores
    main_cpu_pct: float | None
    workers: int
    worker_cpu_pct: list[float]
    loader_cpu_ms_per_image: float | None
    psi_io_some_pct: float | None
    disk_wait_frac: float | None
    disk_busy_pct: float | None
    gpu_util_pct: float | None
    loader: LoaderRow | None
    capacity: CapacityRow | None
    predictions: list[PredictionRow]
    workers_curve: dict[str, float]  # worker count (as a JSON key) → predicted speed-up


class PhaseRow(_PhaseCore, total=False):
    """One entry of ``summary["phases"]`` (``analysis.phases.summarize_phase``). The optional
    keys are added by ``build_summary`` for its own rank's phases (not for other ranks' rows):
    ``checkpoint_write_s`` and ``loader_stages`` always there, ``feature_cache`` only for a
    phase the trainer's feature cache served."""

    checkpoint_write_s: float | None
    checkpoint_in_phase_s: float | None  # the part of checkpoint writes inside the phase
    loader_stages: LoaderStages | None
    feature_cache: bool


class _PhaseAggCore(StepSplitFields):
    phase: str
    phases: int
    steady_steps: int
    images: int
    seconds: float
    images_per_s: float | None
    verdict: str | None
    verdict_weak: bool
    verdict_note: str | None
    input_cause: str | None
    input_evidence: list[str]
    cpu_util_pct: float | None
    gpu_util_pct: float | None
    job_cpu_pct: float | None  # the process tree's CPU, % of the job's cores (the deciding phase)
    loader_cpu_ms_per_image: float | None
    workers: int
    decode_ms_per_image: float | None
    capacity: CapacityRow | None
    loader: LoaderRow | None
    predictions: list[PredictionRow]
    capacity_epoch: int
    checkpoint_in_phase_s: float  # checkpoint writes inside these phases (in their steps)


class PhaseAgg(_PhaseAggCore, total=False):
    """``summary["by_phase"][name]``: train (or val) over all epochs. ``run_kind`` (the loop's
    kind, so a fix speaks its vocabulary) is set by ``build_summary`` once the run is known."""

    run_kind: str


class RunHeader(TypedDict):
    """``summary["run"]``."""

    name: str
    status: str  # completed | failed | interrupted | running
    device: str
    command: str
    started: float
    ended: float | None
    kind: str
    seconds: float | None
    world_size: int
    rank: int
    exit_code: int | None
    augment: str | None  # the trainer's augmentation; None for other loops
    augmented: bool | None  # None where the config does not say (a watched script)
    imports_done: dict[str, float] | None  # watch: framework → Unix time its import finished
    exception: RunException | None  # watch: the uncaught exception that ended the script


class RunException(TypedDict):
    """``summary["run"]["exception"]`` (fact ``run.exception``)."""

    type: str  # builtins by name, others module-qualified
    message: str  # its first line, at most 200 characters
    file: str | None  # where it was raised, outside watch's hooks
    line: int | None


class PoolInfo(TypedDict):
    """``memory["preallocated_pool"]``: a TF/JAX pool, or one process holding the card."""

    framework: str | None
    pool_bytes: int
    gpu_total_bytes: float | None
    why: str
    fix: str


class _MemoryCore(TypedDict):
    device: str  # "cpu" or "cuda:N"
    total_bytes: int | None
    ledger: list[LedgerItem]
    unattributed_bytes: int | None
    unattributed_frac: float | None
    notes: list[str]


class MemorySection(_MemoryCore, total=False):
    """``summary["memory"]`` (and ``host_memory`` on a GPU run). ``peak_t`` and
    ``main_rss_bytes`` exist when the peak was sampled; ``gpu_total_bytes`` for a GPU ledger;
    ``model_file_bytes``, ``footprint_line`` and ``preallocated_pool`` on the device ledger
    ``build_summary`` keeps as ``memory``. ``total_upper_bound``: True where the peak lies in the
    run's rolled-up part and the total adds several processes' highest samples of one slice."""

    peak_t: float
    total_upper_bound: bool
    main_rss_bytes: int
    gpu_total_bytes: float | None
    preallocated_pool: PoolInfo | None
    model_file_bytes: int | None
    footprint_line: str | None


class EpochRow(TypedDict):
    """One of ``summary["epochs"]``: the epoch's phases summed."""

    epoch: int
    seconds: float
    images: int
    disk_read_bytes: int | None
    cache_read_bytes: int | None
    rchar_bytes: int | None
    checkpoint_write_s: float | None


class ModelCheckpointFacts(TypedDict):
    """How a Keras ``ModelCheckpoint`` given to ``fit`` saves (watch's fact)."""

    save_best_only: bool
    save_weights_only: bool


class CheckpointsSection(TypedDict):
    writes: int
    total_s: float
    max_s: float | None
    mean_s: float | None
    keras: ModelCheckpointFacts | None  # the ModelCheckpoint watch read, where it saw one
    between_phases_s: float  # the writes (or their parts) that ran outside every phase


class DatasetFacts(TypedDict):
    files: int | None
    bytes: int | None
    residency_sample_files: int | None


class ModelFacts(TypedDict):
    name: str | None
    params: int | None
    trainable_params: int | None
    file_bytes: int | None
    framework: str | None  # the memory ledger's framework fact (mem.framework)
    precision: str | None
    channels_last: bool | None
    # [first epoch, trainable parameters] at each Keras fit(), or each PyTorch epoch where the
    # count changed (two entries or more: fine-tuning, analysis/thaw.py)
    trainable_by_fit: list[list[int]] | None
    augment_layers: list[str] | None  # Keras: the model's random augmentation layers (watch)


class _KerasCallsMeasured(TypedDict):
    """Keras on TensorFlow, steady training steps (fact ``loop.keras_train_calls``): the step's
    wall time against the graph TensorFlow ran inside it, one train-function call a step."""

    calls: int
    steps_per_execution: int  # batches per call
    step_s: float  # the steps' wall time, summed
    graph_s: float  # the graph's time in them, summed
    wait_s: float  # the data wait in them (inside the graph on TensorFlow), summed
    work_median_s: float  # per call: the graph's time less its data wait, median
    work_p10_s: float  # the same, 10th percentile (its threads warm, as in a long execution)


class KerasTrainCalls(_KerasCallsMeasured, total=False):
    """The same, and what watch adds since 2026-12-06 (an older run's fact lacks them)."""

    callbacks_s: float  # the user's batch callbacks on the loop's thread, summed
    # the same by the callback's class, over all of the run's training steps (since 2026-12-06)
    callbacks_by: dict[str, float]
    # the steps' other_s is all the loop did outside the graph's work (the callbacks, Keras's
    # per-batch Python, the call's dispatch and return: TensorFlow with no GPU); else callbacks
    other_is_loop: bool


# Functional form: "class" is a key (the input's class name, as watch records it).
InputFacts = TypedDict("InputFacts", {
    "kind": str | None, "class": str | None, "workers": int | None,
    "multiprocessing": bool | None, "parallel_calls": int | None, "prefetch": int | bool | None,
    "cache": bool | None, "augments": bool | None,
    # tf.data: a map before the .cache() draws random numbers (the cache replays epoch 1's)
    "augments_cached": bool | None,
    # tf.data: what a map run one call at a time does to images (its batches' narrowest stage)
    "serial_map": str | None,
    # tf.data: a map decodes image files (its ops); one image's bytes as the pipeline yields it
    "decodes": bool | None, "image_bytes": int | None,
    # the process's Python ops (tf.data): share of probe samples that found the GIL held
    "python_gil_held_frac": float | None,
})
InputFacts.__doc__ = ("``summary[\"loader\"][\"val\"]``: the validation input of a Keras ``fit`` "
                      "(watch's ``loader.val_*`` facts), which need not be training's.")

# Functional form: "class" is a key (the loader's class name, as watch records it). The input
# keys are training's; ``val`` holds the validation input's, where watch saw one.
LoaderFacts = TypedDict("LoaderFacts", {
    "framework": str | None, "keras_backend": str | None, "callbacks_timed": bool | None,
    "train_calls": KerasTrainCalls | None,
    # steady training steps whose data wait was not measured (no step-end clock: TensorFlow)
    "wait_unclocked": int | None,
    # the loop's sleep outside TensorFlow's graph calls counted as data wait (loading threads)
    "gil_wait_counted": bool | None,
    "kind": str | None, "class": str | None, "workers": int | None,
    "multiprocessing": bool | None, "parallel_calls": int | None, "prefetch": int | bool | None,
    "cache": bool | None, "augments": bool | None, "python_gil_held_frac": float | None,
    "augments_cached": bool | None, "serial_map": str | None, "decodes": bool | None,
    "image_bytes": int | None, "distribute_strategy": str | None, "distribute_replicas": int | None,
    "val": InputFacts | None,
    # the GIL probe's share held while validation ran (python_gil_held_frac is training's)
    "val_python_gil_held_frac": float | None,
    # a TensorFlow loop written from scratch: training steps whose gradients ran eagerly
    "tf_eager_train_steps": int | None,
})
LoaderFacts.__doc__ = "``summary[\"loader\"]``: what ran the loop and fed it (watch's facts)."


class HostFacts(TypedDict):
    cores: float | None
    mem_total_bytes: float | None
    mem_available_min_bytes: float | None
    bf16: bool | None


class SystemSection(TypedDict):
    """Whole-run system figures: what a watch without steps can still say."""

    cpu_util_pct: float | None
    cpu_util_max_pct: float | None
    tree_cpu_util_pct: float | None
    tree_rss_max_bytes: float | None
    tree_read_bytes: float | None
    tree_rchar_bytes: float | None
    disk_busy_max_pct: float | None
    psi_io_some_pct: float | None
    gpu_util_pct: float | None


class LateStretch(TypedDict):
    first_allreduce: int
    last_allreduce: int
    t_start: float
    t_end: float
    allreduces: int


class RankArrival(TypedDict):
    """The arrival fields of a rank row (``analysis.arrivals.rank_arrival_row``)."""

    allreduces_compared: int
    arrival_late_ms_median: float | None
    arrived_last_frac: float | None
    late_allreduce_frac: float | None
    late_ms_when_late: float | None
    late_ms_mean: float | None  # the others' wait for it, averaged over every all-reduce
    recurrence: str
    arrival_straggler: bool
    late_stretch: LateStretch | None


class _RankCore(TypedDict):
    rank: int
    host: str | None
    node_rank: int | None
    status: str | None
    exit_code: int | None
    steps_compared: int
    straggler: bool
    straggler_by: str | None  # "arrival" | "busy time" (None: a roll-up without arrivals)
    cause: str | None


class RankRow(_RankCore, total=False):
    """One of ``summary["ranks"]``. The per-step merge (``analysis.ranks.merge_ranks``) fills
    every key but the ``wall``/``other``/``transfer`` roll-up figures; a job with many ranks is
    merged from roll-ups (``analysis.rankscale``), which gives ms per step of each part only;
    the arrival keys (:class:`RankArrival`) exist where every rank recorded arrivals."""

    local_rank: int | None
    images: int
    seconds: float
    images_per_s: float | None
    data_wait_frac: float | None
    transfer_frac: float | None
    compute_frac: float | None
    comm_frac: float | None
    other_frac: float | None
    step_ms: float | None
    busy_ms_per_step: float | None
    data_wait_ms_per_step: float | None
    compute_ms_per_step: float | None
    comm_ms_per_step: float | None
    transfer_ms_per_step: float | None
    other_ms_per_step: float | None
    wall_ms_per_step: float | None
    workers: int | None
    main_cpu_pct: float | None
    worker_cpu_pct: float | None
    host_cpu_pct: float | None
    disk_read_bytes: float | None
    input_cause: str | None
    input_evidence: list[str]
    busy_ratio_to_others: float | None
    busiest_step_frac: float | None
    excess_ms_per_step: float | None
    straggler_evidence: list[str]
    # arrival fields, as RankArrival
    allreduces_compared: int
    arrival_late_ms_median: float | None
    arrived_last_frac: float | None
    late_allreduce_frac: float | None
    late_ms_when_late: float | None
    late_ms_mean: float | None  # the others' wait for it, averaged over every all-reduce
    recurrence: str
    arrival_straggler: bool
    late_stretch: LateStretch | None


class _NodeCore(TypedDict):
    host: str
    ranks: list[int]
    stragglers: list[int]


class NodeRow(_NodeCore, total=False):
    """Ranks grouped by node; ``node_rank`` where the launcher numbers nodes."""

    node_rank: int


class _ArrivalJobCore(TypedDict):
    method: str
    allreduces_compared: int
    step_period_ms: float | None
    late_threshold_ms: float
    stragglers: list[int]


class ArrivalJob(_ArrivalJobCore, total=False):
    """``distributed["arrival"]``; ``sample_stride`` when merged from roll-ups."""

    sample_stride: int


class ArrivalAnalysis(TypedDict):
    """``analysis.arrivals.analyze_arrivals``: each rank's arrival fields and the job's."""

    rows: dict[int, RankArrival]
    job: ArrivalJob


class FailedRank(TypedDict):
    rank: int
    status: str | None
    exit_code: int | None


class Distributed(TypedDict, total=False):
    """``summary["distributed"]`` (runs with rank stores only). The per-step merge writes all
    but ``mode``/``median_ms_per_step``; a roll-up merge (``mode: "rollup"``) writes
    ``world_size``, ``ranks_recorded``, ``stragglers``, ``nodes``, ``arrival`` and those two."""

    mode: str
    world_size: int
    ranks_recorded: list[int]
    missing_ranks: list[int]
    hosts: int | None
    images_per_s: float | None
    steps_compared: int
    comm_frac: float | None
    comm_ms_per_step: float | None
    data_wait_frac: float | None
    stragglers: list[int]
    verdict: str | None
    verdict_text: str
    comm_s_includes: str
    arrival: ArrivalJob | None
    nodes: list[NodeRow]
    failed_ranks: list[FailedRank]
    median_ms_per_step: dict[str, float]


class MergedRanks(TypedDict):
    """What a merge of rank stores adds to the summary."""

    ranks: list[RankRow]
    distributed: Distributed


class _SummaryCore(TypedDict):
    schema_version: int
    run: RunHeader
    phases: list[PhaseRow]
    by_phase: dict[str, PhaseAgg]  # "train", "val": the kinds the run had
    epochs: list[EpochRow]
    memory: MemorySection
    host_memory: MemorySection | None  # the CPU ledger beside a GPU one
    checkpoints: CheckpointsSection
    dataset: DatasetFacts
    model: ModelFacts
    loader: LoaderFacts
    host: HostFacts
    system: SystemSection
    ranks: list[RankRow]
    monitor_overhead_frac: float | None
    notes: list[str]
    findings: list[Finding]


class Summary(_SummaryCore, total=False):
    """``summary.json`` (DESIGN.md, schema_version 1); ``distributed`` for runs with rank
    stores."""

    distributed: Distributed


__all__ = ["ArrivalAnalysis", "ArrivalJob", "CapacityRow", "CheckpointsSection", "DatasetFacts", "Distributed",
           "EpochRow", "FailedRank", "HostFacts", "LateStretch", "LoaderFacts", "LoaderRow",
           "LoaderStages", "MemorySection", "MergedRanks", "ModelFacts", "NodeRow", "PhaseAgg",
           "PhaseRow", "PoolInfo", "PredictionRow", "RankArrival", "RankRow", "RunHeader",
           "StepSplitFields", "Summary", "SystemSection"]
