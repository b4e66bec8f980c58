"""``summary.json``: the whole diagnosis of one run as plain data (schema_version 1).

The DESIGN.md contract keys (``run``, ``phases``, ``memory``, ``findings``, ``ranks``,
``monitor_overhead_frac``) are always present; the extra keys (``by_phase``, ``epochs``,
``host_memory``, ``dataset``, ``model``, ``host``, ``checkpoints``, ``notes``) carry the
evidence that ``explain`` and the report quote.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any, cast

from stepscope.analysis.contracts_summary import (
    CheckpointsSection,
    DatasetFacts,
    EpochRow,
    HostFacts,
    InputFacts,
    LoaderFacts,
    MemorySection,
    ModelFacts,
    PhaseAgg,
    PhaseRow,
    RunHeader,
    Summary,
    SystemSection,
)
from stepscope.analysis.findings import build_findings
from stepscope.analysis.gpu_identity import resolve_nvml_index
from stepscope.analysis.keras_loader import stage_fields
from stepscope.analysis.memory import footprint_line, gpu_ledger, host_ledger, phases_window
from stepscope.analysis.phases import (
    PhaseContext,
    PhaseTotals,
    StepSplit,
    nested_seconds,
    phase_window,
    split_fields,
    summarize_phase,
    totals_by_phase,
)
from stepscope.analysis.ranks import add_rank_stores, own_processes
from stepscope.analysis.samples import SampleCache
from stepscope.analysis.spans import covered_s
from stepscope.analysis.verdicts import decide_verdict, gpu_cross_check
from stepscope.analysis.vocab import KERAS, framework_of, vocab
from stepscope.atomic import atomic_write_text
from stepscope.policy import job_cpu_capacity, weighted_mean
from stepscope.store.db import RunReader
from stepscope.store.records import Fact, PhaseRecord, RunInfo, StepRecord
from stepscope.store.rundir import RunDir

SCHEMA_VERSION = 1


def _fact(facts: dict[str, Fact], key: str) -> Any:
    f = facts.get(key)
    return None if f is None else f.value


def _gpu_index(device: str, cache: SampleCache, pids: set[int],
               facts: dict[str, Fact] | None = None) -> int | None:
    """The NVML index of the GPU the run used: ``cuda:N`` mapped by UUID / PCI bus id /
    ``CUDA_VISIBLE_DEVICES`` (analysis/gpu_identity.py), else the first GPU holding one of its
    processes."""
    m = re.match(r"(?:cuda|gpu)(?::(\d+))?", device or "")
    if m:
        n = int(m.group(1) or 0)
        if not device.startswith("cuda"):
            return n
        return resolve_nvml_index(n, {k: f.value for k, f in (facts or {}).items()})[0]
    for src in cache.sources("mem_used_bytes"):
        pm = re.fullmatch(r"gpu(\d+):proc:(\d+)", src)
        if pm and int(pm.group(2)) in pids and (cache.peak(src, "mem_used_bytes").max() or 0) > 0:
            return int(pm.group(1))
    return None


def _cores(facts: dict[str, Fact], cache: SampleCache) -> float | None:
    for key in ("env.cpu_quota_cores", "env.cpu_count"):
        v = _fact(facts, key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    n = sum(1 for s in cache.sources("cpu_util_pct") if re.fullmatch(r"cpu\d+", s))
    return float(n) if n else None


def _stage_facts(facts: dict[str, Fact]) -> dict[int, Any]:
    """Loader stage counters per phase id (``stages.phase.<id>``, written at phase end)."""
    out: dict[int, Any] = {}
    for key, f in facts.items():
        if key.startswith("stages.phase."):
            with contextlib.suppress(ValueError):
                out[int(key.rsplit(".", 1)[1])] = f.value
    return out


def _job_cores(facts: dict[str, Fact], cache: SampleCache) -> float | None:
    """The cores this job may use: affinity capped by the cgroup quota (not the host's)."""
    # CPU capacity, not whole cores: a 1.5-core quota runs 1.5 core-seconds a second of loading.
    found = job_cpu_capacity(_fact(facts, "env.cpu_count"), _fact(facts, "env.cpu_quota_cores"))
    return found if found is not None else _cores(facts, cache)


def _mark_cached_phases(phases: list[PhaseRow], facts: dict[str, Fact]) -> None:
    """Phases served from the trainer's feature cache ran the head alone: their step split
    is about microseconds of tensor slicing, not about the input pipeline or the trunk."""
    used = facts.get("featcache.used")
    uses = used.value.get("uses", []) if used and isinstance(used.value, dict) else []
    cached = {(u.get("epoch"), u.get("phase")) for u in uses if u.get("how") == "cached"}
    for p in phases:
        if (p["epoch"], p["phase"]) in cached:
            p["feature_cache"] = True
            p["verdict_note"] = ("trunk features came from the feature cache: only the head ran, "
                                 "so this phase's split says nothing about loading or the trunk")


UNCLOCKED_NOTE = ("its data wait was not measured (watch: no step of the Keras train function "
                  "ended on the graph clock; a train function whose graph "
                  "has no step-end clock), so waiting for data reads as compute")


def _mark_unclocked(summary: Summary, facts: dict[str, Fact]) -> None:
    """Training phases (and train over all epochs) whose TensorFlow steps had no step-end
    clock: their fetches were never read, so a compute-bound verdict there rests on a data
    wait that was not measured."""
    if not _fact(facts, "loop.keras_wait_unclocked"):
        return
    rows: list[PhaseRow | PhaseAgg] = [p for p in summary["phases"] if p["steps"]]
    rows += summary["by_phase"].values()
    for row in rows:
        if row["phase"] == "train":
            row["verdict_weak"], row["verdict_note"] = True, UNCLOCKED_NOTE


def _run_section(run: RunInfo, cache: SampleCache, facts: dict[str, Fact]) -> RunHeader:
    ended = run.ended
    if ended is None:
        rng = cache.get("host", "cpu_util_pct")
        ended = rng.t[-1] if rng else None
    return {
        "name": run.name, "status": run.status, "device": run.device, "command": run.command,
        "started": run.started, "ended": run.ended, "kind": run.kind,
        "seconds": None if ended is None else max(0.0, ended - run.started),
        "world_size": run.world_size, "rank": run.rank, "exit_code": run.exit_code,
        # The trainer's augmentation ("seed", "none", a YAML file); None for other loops.
        "augment": run.config.get("augment"),
        # Known only where the config says (a watched script's augmentation is not known).
        "augmented": None if run.config.get("augment") is None
        else run.config.get("augment") != "none",
        "imports_done": _fact(facts, "run.imports_done"),
        "exception": _fact(facts, "run.exception"),
    }


def _assign_checkpoints(phases: list[PhaseRow], cache: SampleCache,
                        facts: dict[str, Fact]) -> CheckpointsSection:
    """Give each checkpoint write to the phase running (or last ended) when it began: a write
    is recorded at its end (after the save returns), lasting its value."""
    ck = cache.get("trainer", "checkpoint_write_s")
    for ph in phases:
        ph["checkpoint_write_s"] = None
        ph["checkpoint_in_phase_s"] = None
    for t, v in zip(ck.t, ck.v, strict=True):
        owner = None
        for ph in phases:
            if ph["started"] <= t - v:
                owner = ph
            # a write inside the phase (Keras's save_freq in batches) is in its steps' time
            if (inside := min(t, ph["ended"]) - max(t - v, ph["started"])) > 0:
                ph["checkpoint_in_phase_s"] = (ph["checkpoint_in_phase_s"] or 0.0) + inside
        if owner is not None:
            owner["checkpoint_write_s"] = (owner["checkpoint_write_s"] or 0.0) + v
    spans = [(ph["started"], ph["ended"]) for ph in phases]
    return {"writes": len(ck.v), "total_s": sum(ck.v),
            # a write is sampled at its end, lasting its value: the part of it no phase covers
            "between_phases_s": sum(_uncovered(t - v, t, spans) for t, v in zip(ck.t, ck.v,
                                                                                strict=True)),
            "max_s": cache.peak("trainer", "checkpoint_write_s").max(),
            "keras": _fact(facts, "loop.keras_model_checkpoint"),
            "mean_s": sum(ck.v) / len(ck.v) if ck.v else None}


def _uncovered(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    """How much of ``[a, b]`` no span covers (spans may overlap: phases of other ranks)."""
    return max(0.0, (b - a) - covered_s(a, b, spans))


def _stage_ms(rows: list[PhaseRow], stage: str) -> float | None:
    """Mean ms per image of a loader stage over the phases whose loader was timed."""
    measured = [v for p in rows if (loader := p.get("loader"))
                and (v := (loader["stage_ms_per_image"] or {}).get(stage)) is not None]
    return sum(measured) / len(measured) if measured else None


def _gil_priced(row: PhaseRow) -> bool:
    """A phase whose loading threads were measured GIL-bound, with processes priced."""
    loader = row.get("loader")
    return loader is not None and bool(loader.get("processes_prediction"))


def aggregate_phase_kind(kind: str, phases: list[PhaseRow],
                         totals: dict[int, PhaseTotals]) -> PhaseAgg | None:
    """Train (or val) over all epochs: one steady-state split, verdict and dominant cause."""
    rows = [p for p in phases if p["phase"] == kind]
    if not rows:
        return None
    split = StepSplit()
    waited: dict[int, float] = {}  # phase id -> its steady-state data wait, seconds
    for p in rows:
        s, steady = totals.get(p["phase_id"], PhaseTotals()).steady_split()
        if steady:
            split.merge(s)
            waited[p["phase_id"]] = s.data_wait_s
    fields = split_fields(split)
    v = gpu_cross_check(decide_verdict(fields["data_wait_frac"], fields["transfer_frac"],
                                       fields["other_frac"], split.steps),
                        weighted_mean(rows, "gpu_util_pct"))
    seconds = sum(p["seconds"] for p in rows)
    images = sum(p["images"] for p in rows)
    # The dominant cause is the one behind the most waiting, not the longest phases: a first
    # epoch whose steps each waited 15 ms to receive a batch (main-process) outlasted an epoch
    # that waited 1.6 s on restarted workers, and would have hidden persistent_workers=True.
    causes: dict[str, float] = {}
    for p in rows:
        if p["input_cause"]:
            wait = waited.get(p["phase_id"], p["seconds"] * (p["data_wait_frac"] or 0.0))
            causes[p["input_cause"]] = causes.get(p["input_cause"], 0.0) + wait
    cause = max(causes, key=causes.__getitem__) if v.verdict == "input-bound" and causes else None
    # The evidence, capacities and predicted fixes of the latest phase that decided the cause:
    # the first epoch's steps can run off a queue a loading pool filled while the train
    # function traced (68 ms steps against 86 ms after, pricing a 1.88x rerun at 1.33x). A
    # cause measured on the loading threads themselves (GIL-bound: a fix of its own) speaks for
    # its kind over one read from process samples (the first epoch's tracing, a busy host).
    # Without a cause, the longest phase.
    deciding = [p for p in rows if cause and p["input_cause"] == cause]
    rep = max(deciding, key=lambda p: (_gil_priced(p), p["epoch"])) if deciding \
        else max(rows, key=lambda p: (_gil_priced(p), p["seconds"]))
    evidence: list[str] = rep["input_evidence"] if deciding else []
    return {
        "phase": kind, "phases": len(rows), "steady_steps": split.steps, "images": images,
        "seconds": seconds, "images_per_s": images / seconds if seconds > 0 else None,
        **fields, "verdict": v.verdict, "verdict_weak": v.weak, "verdict_note": v.note,
        "input_cause": cause, "input_evidence": evidence,
        "cpu_util_pct": weighted_mean(rows, "cpu_util_pct"), "gpu_util_pct": weighted_mean(rows, "gpu_util_pct"),
        "job_cpu_pct": rep.get("job_cpu_pct"),
        "loader_cpu_ms_per_image": weighted_mean(rows, "loader_cpu_ms_per_image"),
        "workers": rows[-1]["workers"],
        "decode_ms_per_image": _stage_ms(rows, "decode"),
        "capacity": rep.get("capacity"), "loader": rep.get("loader"),
        "predictions": rep.get("predictions") or [],
        "capacity_epoch": rep["epoch"],
        "checkpoint_in_phase_s": sum(p.get("checkpoint_in_phase_s") or 0.0 for p in rows),
    }


def _epochs(phases: list[PhaseRow]) -> list[EpochRow]:
    out: dict[int, EpochRow] = {}
    for p in phases:
        e = out.setdefault(p["epoch"], {"epoch": p["epoch"], "seconds": 0.0, "images": 0,
                                        "disk_read_bytes": None, "cache_read_bytes": None,
                                        "rchar_bytes": None, "checkpoint_write_s": None})
        e["seconds"] += p["seconds"]
        e["images"] += p["images"]
        # A figure the phase did not measure leaves the epoch's sum as it was (None if none did).
        e["disk_read_bytes"] = _add(e["disk_read_bytes"], p["disk_read_bytes"])
        e["cache_read_bytes"] = _add(e["cache_read_bytes"], p["cache_read_bytes"])
        e["rchar_bytes"] = _add(e["rchar_bytes"], p["rchar_bytes"])
        ck = p.get("checkpoint_write_s")
        if ck is not None:
            e["checkpoint_write_s"] = (e["checkpoint_write_s"] or 0.0) + ck
    return [out[k] for k in sorted(out)]


def _add(total: int | None, n: int | None) -> int | None:
    return total if n is None else (total or 0) + n


def monitor_overhead(facts: dict[str, Fact], cache: SampleCache, run_s: float | None,
                     cores: float | None) -> float | None:
    """The sampler's CPU time over the machine's CPU time during the run (None if unknown)."""
    if not run_s or not cores:
        return None
    cpu_s = _fact(facts, "monitor.cpu_s")
    if isinstance(cpu_s, (int, float)):
        return float(cpu_s) / (run_s * cores)
    pct = cache.get("monitor", "cpu_util_pct").mean()
    return None if pct is None else pct / 100.0 / cores


def _summarize_phases(reader: RunReader, ctx: PhaseContext, rank: int
                      ) -> tuple[list[PhaseRow], dict[int, PhaseTotals]]:
    """(phases of this run's rank, step totals by phase id)."""
    # Per-phase sums from the store (raw steps plus roll-ups); a phase whose steps are all
    # still raw is read step by step (outlier steps need each step's time).
    raw: dict[int, list[StepRecord]] = {}
    for s in reader.steps():
        raw.setdefault(s.phase_id, []).append(s)
    totals = totals_by_phase(reader.aggregates.step_totals(), raw)
    records: list[PhaseRecord] = reader.phases()
    ctx.nested_s = nested_seconds(records, totals)
    every = [summarize_phase(ph, totals.get(ph.phase_id, PhaseTotals()), ctx) for ph in records]
    return [p for p in every if (p["rank"] or 0) == rank], totals


def _loader_section(facts: dict[str, Fact]) -> LoaderFacts:
    """What ran the loop and fed it (watch's ``loop.*``/``loader.*`` facts; None elsewhere)."""
    return {"framework": _fact(facts, "loop.framework"),
            "keras_backend": _fact(facts, "loop.keras_backend"),
            "callbacks_timed": _fact(facts, "loop.keras_callbacks_timed"),
            "gil_wait_counted": _fact(facts, "loop.keras_gil_wait"),
            "train_calls": _fact(facts, "loop.keras_train_calls"),
            "wait_unclocked": _fact(facts, "loop.keras_wait_unclocked"),
            "distribute_strategy": _fact(facts, "loop.distribute_strategy"),
            "distribute_replicas": _fact(facts, "loop.distribute_replicas"),
            "tf_eager_train_steps": _fact(facts, "loop.tf_eager_train_steps"),
            **_input_facts(facts, "loader.", "train"),
            "val_python_gil_held_frac": _python_gil_held(facts, "val"),
            "val": _input_facts(facts, "loader.val_", "val") if "loader.val_kind" in facts
            else None}


def _input_facts(facts: dict[str, Fact], prefix: str, phase: str) -> InputFacts:
    """One input's facts (``describe_input``: ``loader.*`` for training, ``loader.val_*``)."""
    return {"kind": _fact(facts, prefix + "kind"), "class": _fact(facts, prefix + "class"),
            "workers": _fact(facts, prefix + "workers"),
            "multiprocessing": _fact(facts, prefix + "multiprocessing"),
            "parallel_calls": _fact(facts, prefix + "parallel_calls"),
            "prefetch": _fact(facts, prefix + "prefetch"), "cache": _fact(facts, prefix + "cache"),
            "augments": _fact(facts, prefix + "augments"),
            "augments_cached": _fact(facts, prefix + "augments_cached"),
            "serial_map": _fact(facts, prefix + "serial_map"),
            "decodes": _fact(facts, prefix + "decodes"),
            "image_bytes": _fact(facts, prefix + "image_bytes"),
            "python_gil_held_frac": _python_gil_held(facts, phase)}


PYTHON_GIL_MIN_SAMPLES = 20


def _python_gil_held(facts: dict[str, Fact], phase: str) -> float | None:
    """Share of the GIL probe's samples that found it held while ``phase``'s kind was open
    (``loop.python_gil``'s ``by_phase``; a run recorded before it had one figure for the
    process), None under ``PYTHON_GIL_MIN_SAMPLES``."""
    found = _fact(facts, "loop.python_gil")
    if not isinstance(found, dict):
        return None
    by = found.get("by_phase")
    samples, held = (by.get(phase) or [0, 0]) if isinstance(by, dict) \
        else (found.get("samples"), found.get("held"))
    if int(samples or 0) < PYTHON_GIL_MIN_SAMPLES:
        return None
    return int(held or 0) / int(samples or 1)


def _dataset_facts(facts: dict[str, Fact]) -> DatasetFacts:
    return {"files": _fact(facts, "dataset.files"), "bytes": _fact(facts, "dataset.bytes"),
            "residency_sample_files": _fact(facts, "dataset.residency_sample_files")}


def _model_facts(facts: dict[str, Fact]) -> ModelFacts:
    return {"name": _fact(facts, "model.name"), "params": _fact(facts, "model.params"),
            "trainable_params": _fact(facts, "model.trainable_params"),
            "file_bytes": _fact(facts, "model.file_bytes"),
            "framework": _fact(facts, "mem.framework"),
            "precision": _fact(facts, "train.precision"),
            "channels_last": _fact(facts, "train.channels_last"),
            "trainable_by_fit": _fact(facts, "model.trainable_by_fit"),
            "augment_layers": _fact(facts, "model.augment_layers")}


def _host_facts(facts: dict[str, Fact], cache: SampleCache, cores: float | None,
                device: str | None) -> HostFacts:
    # Native bf16 on the device that trained: the trainer's own fact, else the CPU's flags
    # where the run trained on the CPU (a GPU's is not read from the host).
    bf16 = _fact(facts, "env.bf16")
    if bf16 is None and device == "cpu":
        bf16 = _fact(facts, "env.cpu_bf16")
    return {"cores": cores, "mem_total_bytes": cache.peak("host", "mem_total_bytes").max(),
            "mem_available_min_bytes": cache.get("host", "mem_available_bytes").min(),
            "bf16": bf16}


def _memory(cache: SampleCache, reader: RunReader, main_pid: int | None, gpu: int | None,
            facts: dict[str, Fact], is_gpu_run: bool) -> tuple[MemorySection, MemorySection | None]:
    processes = reader.processes()
    window = phases_window(reader.phases())
    host = host_ledger(cache, main_pid, processes, facts, gpu_run=is_gpu_run and gpu is not None,
                       window=window)
    if not is_gpu_run or gpu is None:
        device, host_extra = host, None
    else:
        pids = {p.pid for p in processes} | ({main_pid} if main_pid else set())
        device, host_extra = gpu_ledger(cache, gpu, pids, facts, window), host
    model_file = _fact(facts, "model.file_bytes")
    device["model_file_bytes"] = model_file
    device["footprint_line"] = footprint_line(model_file, device["total_bytes"])
    device.setdefault("preallocated_pool", None)
    return device, host_extra


def build_summary(reader: RunReader) -> Summary:
    """The diagnosis of one run as a JSON-ready dict (DESIGN.md ``summary.json``, schema 1).

    Examples:
        >>> with RunReader(Path("runs/demo")) as r:
        ...     s = build_summary(r)
        >>> s["phases"][0]["verdict"]
        'input-bound'
    """
    run = reader.run()
    facts = reader.facts()
    cache = SampleCache(reader)
    main_pid, own = own_processes(reader)  # a watched rank: its process, not the launcher
    pids = {p.pid for p in reader.processes()} | ({main_pid} if main_pid else set())
    gpu = _gpu_index(run.device, cache, pids, facts)
    is_gpu_run = gpu is not None
    ctx = PhaseContext(cache=cache, processes=own, main_pid=main_pid,
                       gpu_index=gpu, stages=_stage_facts(facts), cores=_job_cores(facts, cache),
                       host_cores=sum(1 for s in cache.sources("cpu_util_pct")
                                      if re.fullmatch(r"cpu\d+", s)) or None,
                       worker_word=vocab(framework_of({"loader": _loader_section(facts)})).worker,
                       stage_causes=framework_of({"loader": _loader_section(facts)}) != KERAS)
    phases, totals = _summarize_phases(reader, ctx, run.rank)
    _mark_cached_phases(phases, facts)
    for p in phases:  # ImageDataGenerator stages (Keras under watch)
        f = facts.get(f"keras_stages.phase.{p['phase_id']}")
        p["loader_stages"] = stage_fields(f.value if f else None, p.get("seconds"))
    checkpoints = _assign_checkpoints(phases, cache, facts)
    cores = _cores(facts, cache)
    run_section = _run_section(run, cache, facts)
    memory, host_memory = _memory(cache, reader, main_pid, gpu, facts, is_gpu_run)
    notes = [f"{n.source}: {n.text}" for n in reader.notes()]
    if not any(p["steps"] for p in phases):
        notes.append("no training steps were recorded (a script without a supported loop, or "
                     "no phases marked): only system-level figures are available")
    summary: Summary = {
        "schema_version": SCHEMA_VERSION,
        "run": run_section,
        "phases": phases,
        "by_phase": {k: agg for k in ("train", "val")
                     if (agg := aggregate_phase_kind(k, phases, totals)) is not None},
        "epochs": _epochs(phases),
        "memory": memory,
        "host_memory": host_memory,
        "checkpoints": checkpoints,
        "dataset": _dataset_facts(facts),
        "model": _model_facts(facts),
        "loader": _loader_section(facts),
        "host": _host_facts(facts, cache, cores, run.device),
        "system": _system_section(cache, gpu),
        # Distributed runs: filled from the rank stores by add_rank_stores (analysis/ranks.py).
        "ranks": [],
        "monitor_overhead_frac": monitor_overhead(facts, cache, run_section["seconds"], cores),
        "notes": notes,
        "findings": [],
    }
    for agg in summary["by_phase"].values():
        agg["run_kind"] = run.kind  # the fix speaks the loop's vocabulary (trainer flags, API)
    _mark_unclocked(summary, facts)
    summary["findings"] = build_findings(summary)
    return summary


def _system_section(cache: SampleCache, gpu: int | None = None) -> SystemSection:
    """Whole-run system figures: what a watch without steps can still say."""
    disks = [s for s in cache.sources("read_bytes_per_s") if s.startswith("disk:")]
    return {
        "cpu_util_pct": cache.get("host", "cpu_util_pct").mean(),
        "cpu_util_max_pct": cache.peak("host", "cpu_util_pct").max(),
        "tree_cpu_util_pct": cache.get("tree", "cpu_util_pct").mean(),
        "tree_rss_max_bytes": cache.peak("tree", "rss_bytes").max(),
        "tree_read_bytes": _last_minus_first(cache, "tree", "read_bytes"),
        "tree_rchar_bytes": _last_minus_first(cache, "tree", "rchar_bytes"),
        "disk_busy_max_pct": max((cache.peak(d, "busy_pct").max() or 0.0 for d in disks),
                                 default=None),
        "psi_io_some_pct": cache.get("host", "psi_io_some_pct").mean(),
        "gpu_util_pct": cache.get(f"gpu{gpu or 0}", "util_pct").mean(),
    }


def _last_minus_first(cache: SampleCache, source: str, metric: str) -> float | None:
    s = cache.get(source, metric)
    return s.v[-1] - s.v[0] if s else None


def write_summary(run_dir: Path) -> Summary:
    """Build the summary from ``run_dir/run.db`` and write ``run_dir/summary.json`` atomically.

    Examples:
        >>> s = write_summary(Path("runs/demo"))
        >>> (Path("runs/demo") / "summary.json").is_file()
        True
    """
    run_dir = Path(run_dir)
    with RunReader(run_dir) as reader:
        summary = build_summary(reader)
    # A distributed run: rank 0 wrote run.db, the others run.rank<k>.db; merge their view.
    add_rank_stores(summary, run_dir)
    # Write-then-rename: a reader (the live report, `compare`) never sees half a file.
    atomic_write_text(RunDir(run_dir).summary,
                      json.dumps(summary, indent=2, default=_json_default) + "\n")
    return summary


def _json_default(o: object) -> Any:
    return str(o)


def load_summary(run_dir: Path) -> Summary:
    """Read ``summary.json`` back (the CLI's ``explain`` and ``compare`` use it). Trusted as a
    :class:`Summary`: this module wrote it (schema_version 1)."""
    return cast("Summary", json.loads(RunDir(Path(run_dir)).summary.read_text()))


__all__ = ["build_summary", "load_summary", "phase_window", "write_summary"]
