"""Plain-words answers from a summary: the headline first, then how phases and epochs differ,
then memory, then the seed's own observations and inferences where the run shows them.

Every number quoted comes from ``summary.json`` (itself traceable to stored records).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath

from stepscope.analysis import budget, epoch_one, thaw
from stepscope.analysis.causes import receiving_was_the_wait
from stepscope.analysis.contracts_summary import (
    EpochRow,
    MemorySection,
    PhaseAgg,
    RunHeader,
    Summary,
)
from stepscope.analysis.epoch_one import (
    epoch_was_cold,
    kept_how,
    kept_in_process,
    training_kept,
)
from stepscope.analysis.evidence import claim, holds
from stepscope.analysis.fmt import (
    fmt_bytes,
    fmt_count,
    fmt_img_s,
    fmt_ms,
    fmt_pct,
    fmt_pct_value,
    fmt_s,
    ms_of,
)
from stepscope.analysis.keras_loader import (
    augments_cached_answer,
    stages_answer,
    val_augmented_answer,
    workers_answer,
)
from stepscope.analysis.keras_spe import callbacks_named
from stepscope.analysis.train_val import train_vs_val
from stepscope.analysis.verdicts import stayed_resident
from stepscope.analysis.vocab import (
    KERAS,
    KERAS_THREADS_GIL,
    framework_of,
    keras_workers_spare,
    phase_input,
    vocab,
)

CHECKPOINT_BUSY_S = 0.5
OTHER_READS_FRAC = 0.05  # physical reads past 5 % of a resident dataset are worth a sentence


@dataclass(frozen=True)
class Answer:
    """One numbered answer: a short title and a paragraph with the numbers inline."""

    number: int
    title: str
    text: str


_CAUSE_WORDS = {
    # {prep}: what preparing was, as far as it was measured (see _preparing_words).
    "cpu": "the CPU preparing batches{prep} could not keep up: the cores this job may use were "
           "all taken, so more workers cannot help",
    "storage": "the loader waited on the disk",
    "main-process": "the training process itself did the loader's per-batch work (collate, "
                    "pin-memory) while the loop waited",
}


def _preparing_words(s: Summary, kind: str) -> str:
    """What preparing a batch was, as far as it was measured (decode stage, augmentation)."""
    decoded = holds(s, f"decoded_{kind}")
    augmented = kind == "train" and holds(s, "augmented")
    what = " and ".join(w for w, ok in (("decoding", decoded), ("augmenting", augmented)) if ok)
    return f" ({what} the images)" if what else ""


def _cause_words(s: Summary, cause: str, agg: PhaseAgg | None = None) -> str:
    loader = agg.get("loader") if agg is not None else None
    if cause == "workers" and framework_of(s) == KERAS and loader is not None \
            and loader.get("threads_gil_bound") and loader.get("processes_prediction"):
        # measured on the loading threads (analysis/causes.decide_threads_cause)
        return KERAS_THREADS_GIL
    if cause == "workers" and framework_of(s) == KERAS:  # the loader in the framework's words
        phase = agg["phase"] if agg is not None else "train"
        cores = (s.get("host") or {}).get("cores")
        return keras_workers_spare(phase_input(s.get("loader"), phase), phase, int(cores or 2))
    if cause == "workers":
        return vocab(framework_of(s)).workers_cause
    if cause == "main-process" and agg is not None \
            and receiving_was_the_wait(agg.get("input_evidence")):
        return IDLE_WORKERS_WORDS
    return _CAUSE_WORDS.get(cause, cause)


IDLE_WORKERS_WORDS = ("the training process was slow to take each batch from its workers while "
                      "they sat mostly idle")


def _split_words(agg: PhaseAgg) -> str:
    return (f"A step took {ms_of(agg['step_ms_per_step'])}: {ms_of(agg['data_wait_ms_per_step'])} "
            f"waiting for data, {ms_of(agg['transfer_ms_per_step'])} copying to the device, "
            f"{ms_of(agg['compute_ms_per_step'])} computing and {ms_of(agg['other_ms_per_step'])} "
            f"other; {fmt_img_s(agg['images_per_s'])} over the phase.")


def headline(s: Summary) -> tuple[str, str] | None:
    agg = (s.get("by_phase") or {}).get("train") or (s.get("by_phase") or {}).get("val")
    if not agg or agg.get("verdict") is None:
        return "No training steps were recorded", _system_only(s) + _ended_early(s)
    kind = "Training" if agg["phase"] == "train" else "Validation"
    v = agg["verdict"]
    if v == "input-bound":
        text = f"{kind} was input-bound: {fmt_pct(agg['data_wait_frac'])} of every step waited for data"
        if cause := agg.get("input_cause"):
            words = _cause_words(s, cause, agg)
            text += "; " + words.replace("{prep}", _preparing_words(s, agg["phase"]))
            if agg.get("input_evidence"):
                text += " (" + "; ".join(agg["input_evidence"]) + ")"
        text += "."
        if (only := epoch_one.first_epoch_only(s)) is not None:
            text += f" Only epoch {only.first['epoch']} waited: {only.later_words()}."
    elif v == "compute-bound":
        text = (f"{kind} was compute-bound: {fmt_pct(agg['compute_frac'])} of every step was the "
                f"model's own work; data wait was {fmt_pct(agg['data_wait_frac'])}.")
    elif v == "transfer-bound":
        text = (f"{kind} was transfer-bound: {fmt_pct(agg['transfer_frac'])} of every step copied "
                "the batch to the device.")
    else:
        what = claim(s, "keras_other_is_loop", "Keras's per-batch Python and callbacks, the "
                     "train function's dispatch and return: the step outside TensorFlow's "
                     "graph, timed by watch") or "logging, metrics, syncs"
        text = (f"{kind} was overhead-bound: {fmt_pct(agg['other_frac'])} of every step was loop "
                f"overhead outside data, copy and compute ({what}).")
        if (named := callbacks_named(s)) is not None:
            text += (f" The script's batch callbacks held the loop {fmt_ms(named[1])} a step: "
                     f"{named[0]} (timed by watch, each callback's on_train_batch_begin/_end).")
        if (written := budget.checkpoints_in_overhead(agg)) is not None:
            text += (f" Most of it was checkpoints written inside the steps: "
                     f"{fmt_s(written[0])}, timed around each save.")
    text += " " + _split_words(agg)
    text += claim(s, "tf_distribute", _strategy_words(s))
    if agg.get("verdict_weak") and agg.get("verdict_note"):
        text += f" This verdict is weak: {agg['verdict_note']}."
    return f"{kind} was {v}", text + _ended_early(s)


def _ended_early(s: Summary) -> str:
    """A run that did not complete: where it stopped, so the figures read as what ran."""
    run = s.get("run") or {}
    status, code = run.get("status"), run.get("exit_code")
    if status not in ("failed", "interrupted"):
        return ""
    phases = s.get("phases") or []
    how = f"exited with code {code}" if code else "was interrupted" if status == "interrupted" \
        else "failed"
    where = f" in epoch {phases[-1]['epoch']}'s {phases[-1]['phase']} phase" if phases else ""
    steps = sum(p.get("steps") or 0 for p in phases)
    return (f" The command {how}{where} (run status: {status}){_raised(run)}: these figures "
            f"cover the {steps:,} steps it ran.")


def _raised(run: RunHeader) -> str:
    """What ended it, where watch's excepthook caught the exception."""
    exc = run.get("exception")
    if not exc:
        return ""
    message = f": {exc['message']}" if exc.get("message") else ""
    file = exc.get("file")
    at = f" at {PurePath(file).name}:{exc['line']}" if file else ""
    return f", raising {exc['type']}{message}{at} (the uncaught exception, watch's sys.excepthook)"


def _strategy_words(s: Summary) -> str:
    loader = s.get("loader") or {}
    replicas = loader.get("distribute_replicas")
    count = "" if replicas is None else \
        f" with {replicas} replica{'s' if replicas != 1 else ''} in sync"
    return (f" The model ran under tf.distribute {loader.get('distribute_strategy')}{count} "
            "(watch: model.distribute_strategy); its input was a distributed dataset, whose "
            "data wait is not measured (recorded as 0).")


def _system_only(s: Summary) -> str:
    sysf = s.get("system") or {}
    parts = [f"host CPU averaged {fmt_pct_value(sysf.get('cpu_util_pct'))} "
             f"(peak {fmt_pct_value(sysf.get('cpu_util_max_pct'))})"]
    rchar, disk = sysf.get("tree_rchar_bytes"), sysf.get("tree_read_bytes")
    if rchar is not None and disk is not None and disk > rchar:
        # read_bytes counts pages faulted in from mapped files (the libraries an import maps)
        # where rchar counts only read() calls: more from disk than read is not a contradiction
        parts.append(f"the processes read {fmt_bytes(rchar)} through read calls and "
                     f"{fmt_bytes(disk)} from disk (/proc/PID/io: mapped files, such as the "
                     "libraries an import loads, count there only)")
    elif rchar is not None:
        parts.append(f"the processes read {fmt_bytes(rchar)} of files, "
                     f"{fmt_bytes(disk)} of it from disk")
    if sysf.get("tree_rss_max_bytes") is not None:
        parts.append(f"their memory peaked at {fmt_bytes(sysf['tree_rss_max_bytes'])} (RSS)")
    if sysf.get("gpu_util_pct") is not None:
        parts.append(f"the GPU ran kernels {sysf['gpu_util_pct']:.0f} % of the time")
    return ("Only system-level figures exist (no loop was timed, so no step split or verdict): "
            + "; ".join(parts) + ".")


def _epoch_disk_line(e: EpochRow, resid: float | None) -> str:
    line = (f"epoch {e['epoch']} read {fmt_bytes(e['disk_read_bytes'])} from disk and "
            f"{fmt_bytes(e['rchar_bytes'])} in all")
    if resid is not None:
        line += f" (dataset {fmt_pct(resid)} resident in the page cache at its start)"
    return line


def _stayed_resident(s: Summary, epoch: int) -> bool:
    """The dataset's residency stayed high at each of the epoch's phases' start and end."""
    return stayed_resident([m for p in s.get("phases") or [] if p["epoch"] == epoch
                            for m in (p.get("dataset_resident_frac_start"),
                                      p.get("dataset_resident_frac_end"))])


def cold_vs_warm(s: Summary) -> tuple[str, str] | None:
    epochs = [e for e in s.get("epochs") or [] if e.get("disk_read_bytes") is not None]
    if not epochs or not holds(s, "dataset_files"):
        return None  # an in-memory dataset: its reads are library page-ins, not its files
    starts: dict[int, float | None] = {}
    for p in s.get("phases") or []:
        starts.setdefault(p["epoch"], p.get("dataset_resident_frac_start"))
    ds_bytes = (s.get("dataset") or {}).get("bytes")
    first = epochs[0]
    line = _epoch_disk_line(first, starts.get(first["epoch"]))
    text = line[:1].upper() + line[1:]
    disk = first["disk_read_bytes"] or 0
    if ds_bytes and disk > OTHER_READS_FRAC * ds_bytes and _stayed_resident(s, first["epoch"]):
        # /proc's read_bytes counts every file the process faulted or read in: libraries
        # that a first step pages in (a traced graph's kernels) read as "the dataset" otherwise.
        text += claim(s, "disk_reads_not_dataset",
                      f"; the dataset is {fmt_bytes(ds_bytes)} and stayed in the page cache "
                      "through the epoch (its files' residency at each phase's start and end), "
                      "so none of those physical reads were its files: they were other files "
                      "the process read or paged in")
    elif ds_bytes:
        text += f"; the dataset is {fmt_bytes(ds_bytes)}, so physical reads were " \
                f"{fmt_pct(disk / ds_bytes)} of it"
    text += "."
    if not epoch_was_cold(s, first):
        text += claim(s, "page_cache_served", " The files were already in the kernel's page "
                      "cache, so reads were served from memory from the start.")
        return "Why the disk stayed idle", text
    later = epochs[1:]
    if later:
        text += " Later: " + "; ".join(_epoch_disk_line(e, starts.get(e["epoch"])) for e in later) + "."
        warm = all((e["disk_read_bytes"] or 0) <= 0.1 * max(1, e["rchar_bytes"] or 0)
                   for e in later)
        if kept_in_process(first, later):
            text += (" Later epochs did not read the files again: the program kept what epoch "
                     f"{first['epoch']} read, so the disk had nothing to do" + kept_how(s) + ".")
        elif warm and training_kept(s):
            text += (" Later epochs' training read no files again: the program kept what it had "
                     "read" + kept_how(s) + "; their validation read its files again, and the "
                     "kernel's page cache served them, so the disk had nothing to do.")
        elif warm:
            text += (" The program read every file again each epoch, but the kernel's page cache "
                     "served them from memory, so the disk had nothing to do.")
        else:
            text += " Later epochs still read from disk: the page cache did not keep the files."
    rates = _phase_read_rates(s, first["epoch"])
    if rates:
        text += " " + rates
    return "Why the disk was busy, then idle", text


def _phase_read_rates(s: Summary, epoch: int) -> str:
    ph = {p["phase"]: p for p in s.get("phases") or [] if p["epoch"] == epoch}
    tr, va = ph.get("train"), ph.get("val")
    if not tr or not va:
        return ""
    va_rate, tr_rate = va["disk_read_rate_bytes_per_s"], tr["disk_read_rate_bytes_per_s"]
    if not va_rate or not tr_rate:
        return ""
    text = (f"In epoch {epoch} validation read from disk at {fmt_bytes(va_rate)}/s against "
            f"{fmt_bytes(tr_rate)}/s in training: its files were new to the cache too")
    if va_rate > tr_rate and holds(s, "augmented"):
        return text + ", and without augmentation the loader consumes them faster."
    return text + "."


def cpu_pattern(s: Summary) -> tuple[str, str] | None:
    bp = s.get("by_phase") or {}
    tr, va = bp.get("train"), bp.get("val")
    if not tr or tr.get("cpu_util_pct") is None:
        return None
    cores = (s.get("host") or {}).get("cores")
    text = f"Host CPU averaged {fmt_pct_value(tr['cpu_util_pct'])}"
    text += f" of {cores:.0f} cores" if cores else ""
    text += " during training"
    if va and va.get("cpu_util_pct") is not None:
        text += f" and {fmt_pct_value(va['cpu_util_pct'])} during validation"
    text += "."
    ws = [p for p in s.get("phases") or [] if p.get("worker_cpu_pct")]
    if ws:
        p = ws[0]
        n = len(p["worker_cpu_pct"])
        text += (f" In epoch {p['epoch']} {p['phase']} the {fmt_count(n, vocab(framework_of(s)).worker)} "
                 f"{'was' if n == 1 else 'were'} at "
                 + ", ".join(f"{c:.0f} %" for c in p["worker_cpu_pct"]) + " of a core.")
    ck = s.get("checkpoints") or {}
    if ck.get("writes"):
        mean_s = ck["mean_s"] or 0.0
        took = fmt_s(mean_s) if mean_s >= 0.1 else fmt_ms(mean_s)
        text += f" Checkpoints were written {ck['writes']} times, {took} each on average"
        busier = va is not None and (va.get("cpu_util_pct") or 0) > (tr["cpu_util_pct"] or 0) + 5
        between = ck.get("between_phases_s")  # None: a summary written before it was measured
        at_end = between is None or between >= 0.5 * ck["total_s"]  # not inside the steps
        if at_end and (busier or mean_s >= CHECKPOINT_BUSY_S):
            text += ("; validation plus the checkpoint write make the end of each epoch the "
                     "busiest part")
        text += "."
    return "What the CPU was doing", text


def gpu_pattern(s: Summary) -> tuple[str, str] | None:
    bp = s.get("by_phase") or {}
    tr, va = bp.get("train"), bp.get("val")
    if not tr or tr.get("gpu_util_pct") is None:
        return None
    text = f"NVML reported the GPU {tr['gpu_util_pct']:.0f} % utilised in training"
    if va and va.get("gpu_util_pct") is not None:
        text += f" and {va['gpu_util_pct']:.0f} % in validation"
    text += (". That figure is the share of time at least one kernel was running, not how busy the "
             f"GPU was. In training the loop waited for data {fmt_pct(tr['data_wait_frac'])} of "
             "each step" + claim(s, "gpu_idles_waiting", ", and the GPU idles while it waits"))
    if va and va.get("data_wait_frac") is not None:
        text += (f"; validation waited {fmt_pct(va['data_wait_frac'])} and has no backward pass, "
                 "so its kernels come closer together")
    return "What the GPU utilisation means", text + "."


def _ledger_words(mem: MemorySection) -> str:
    items = ", ".join(f"{i['item']} {fmt_bytes(i['bytes'])}" for i in mem.get("ledger") or [])
    text = items or "no items measured"
    if mem.get("unattributed_bytes") is not None:
        text += (f"; unattributed {fmt_bytes(mem['unattributed_bytes'])} "
                 f"({fmt_pct(mem.get('unattributed_frac'))})")
    return text


def memory_answer(s: Summary) -> tuple[str, str] | None:
    mem = s.get("memory") or {}
    if mem.get("total_bytes") is None:
        return None
    gpu = str(mem.get("device", "")).startswith("cuda")
    what = "GPU memory (NVML, this process)" if gpu else "Process memory (training RSS + workers' USS)"
    text = (f"{what} at its peak: {_at_most(mem)}{fmt_bytes(mem['total_bytes'])} = "
            f"{_ledger_words(mem)}.")
    if mem.get("footprint_line"):
        text += (f" Side by side: {mem['footprint_line']}. The file holds only the weights; "
                 "training also needs gradients and optimizer state for the trainable part, "
                 "activations for the batch, workspaces and the runtime.")
    pool = mem.get("preallocated_pool")
    if pool:
        text += f" Most of it is a preallocated pool: {pool['why']}. The fix: {pool['fix']}."
    host = s.get("host_memory")
    if gpu and host and host.get("total_bytes") is not None:
        text += (f" On the host: {_at_most(host)}{fmt_bytes(host['total_bytes'])} "
                 f"({_ledger_words(host)}).")
    return "Where the memory went", text


def _at_most(mem: MemorySection) -> str:
    # A peak in the run's rolled-up part: only each process's highest sample of the slice is
    # kept, so their sum bounds the total from above (memory.py says so in the ledger's notes).
    return ("at most (each process's highest sample of the roll-up slice of the peak, summed) "
            if mem.get("total_upper_bound") else "")


def _peak_process_bytes(s: Summary) -> float | None:
    host = s.get("host_memory") or s.get("memory") or {}
    if str(host.get("device", "")).startswith("cuda"):
        return None
    return host.get("main_rss_bytes") or host.get("total_bytes")


def ram_inference(s: Summary) -> tuple[str, str] | None:
    """The seed's inference 2: 'after epoch 1 all images are in RAM, so the disk is idle'.

    The proof that the program does not hold the images: it reads the files again every epoch
    (``rchar``), which a program caching them would not; the page cache serves those reads.
    """
    epochs = [e for e in s.get("epochs") or [] if e.get("disk_read_bytes") is not None]
    if len(epochs) < 2:
        return None
    first, later = epochs[0], epochs[-1]
    if not holds(s, "dataset_files") or not epoch_was_cold(s, first):
        return None  # nothing came from disk in epoch 1: the run does not show the transition
    later_rchar, later_disk = later["rchar_bytes"], later["disk_read_bytes"] or 0
    ds, rss = (s.get("dataset") or {}).get("bytes"), _peak_process_bytes(s)
    peak = (f" The training process peaked at {fmt_bytes(rss)}; the dataset is {fmt_bytes(ds)}."
            if ds and rss is not None else "")
    if kept_in_process(first, epochs[1:]):
        return ("Inference checked: \"after epoch 1 the images are in RAM\"",
                f"Right, in the training process's own memory. In epoch {later['epoch']} the "
                f"program read {fmt_bytes(later_rchar or 0)} of files (epoch {first['epoch']}: "
                f"{fmt_bytes(first['rchar_bytes'])}): it kept what it had read"
                + (kept_how(s) or " (how, watch did not see)") + "." + peak
                + " A dataset larger than free RAM would not fit there.")
    if not later_rchar or later_disk > 0.1 * later_rchar:
        return None
    resid = [p.get("dataset_resident_frac_start") for p in s.get("phases") or []
             if p["epoch"] == later["epoch"]]
    r = resid[0] if resid and resid[0] is not None else None
    if training_kept(s):
        return ("Inference checked: \"after epoch 1 the images are in RAM\"",
                "Right for training, in the training process's own memory: its training phases "
                "after the first read no files, it kept what it had read"
                + (kept_how(s) or " (how, watch did not see)") + ". Validation's files were "
                f"read again every epoch ({fmt_bytes(later_rchar)} in epoch {later['epoch']}, "
                f"{fmt_bytes(later_disk)} of it from disk): the kernel's page cache kept those."
                + peak)
    text = (f"Right about RAM, wrong about whose. In epoch {later['epoch']} the program read "
            f"{fmt_bytes(later['rchar_bytes'])} of files again (epoch {first['epoch']}: "
            f"{fmt_bytes(first['rchar_bytes'])}) but only {fmt_bytes(later['disk_read_bytes'])} "
            "came from disk")
    text += f"; the dataset was {fmt_pct(r)} resident in the OS page cache" if r is not None else ""
    first_rchar = first["rchar_bytes"] or 0
    rereads = first_rchar > 0 and later_rchar >= 0.5 * first_rchar
    redecodes = claim(s, "decoded_train", " and re-decodes")
    text += (". A program that kept the images would not read the files again: the kernel keeps "
             f"the files, and every epoch the program re-reads{redecodes} them (the CPU cost "
             "stays)." if rereads else ".")
    text += peak + " With a dataset larger than free RAM the disk would stay busy."
    return "Inference checked: \"after epoch 1 the images are in RAM\"", text


# Validation that read under this many bytes of files an image made no image from a file (a
# 28 px PNG is ~300 B); loading under this share of the time a validation image took is the
# framework's slicing, not worth a "Half right".
FILE_BYTES_PER_IMAGE_MIN = 64
NEGLIGIBLE_LOAD_FRAC = 0.25


def _val_from_memory(s: Summary, load: float, step: float | None) -> str | None:
    """The seed's inference holds where validation's batches come from memory: its phases read
    no files (read calls), no decode was timed, and loading took a small share of its time (a
    Keras fit on NumPy arrays, a tf.data pipeline whose cache() holds decoded tensors)."""
    val = [p for p in s.get("phases") or [] if p["phase"] == "val"]
    read = [p.get("rchar_bytes") for p in val]
    images = sum(p.get("images") or 0 for p in val)
    if not step or not images or None in read or holds(s, "decoded_val") \
            or load >= NEGLIGIBLE_LOAD_FRAC * step:
        return None
    files = sum(r or 0 for r in read)
    if files >= FILE_BYTES_PER_IMAGE_MIN * images:
        return None
    return (f"Right for this run: validation read {fmt_bytes(files)} of files for its "
            f"{images:,} images (the processes' read calls) and no decode was timed; loading "
            f"took {ms_of(load)} a validation image, {fmt_pct(load / step)} of the "
            f"{ms_of(step)} each one took in validation (its steps' time per image). Its "
            "batches reach the model as they lie in memory.")


def val_inference(s: Summary) -> tuple[str, str] | None:
    """The seed's inference 1: 'validation passes batches straight from RAM to the GPU'."""
    va = (s.get("by_phase") or {}).get("val")
    tr = (s.get("by_phase") or {}).get("train")
    if not va or not tr:
        return None
    lv, lt = va.get("loader_cpu_ms_per_image"), tr.get("loader_cpu_ms_per_image")
    if lv is not None and lt is not None and lv > 0:
        cost = (f"the loader still spent {ms_of(lv)} of CPU per validation image against {ms_of(lt)} "
                "per training image")
        load = lv
    elif va.get("workers") == 0 and (waited := va.get("data_wait_ms_per_image")):
        # With workers=0 the wait is the loading itself, done inline by the training process.
        load = waited
        cost = f"the training process still spent {ms_of(load)} loading each validation image"
    else:
        return None
    from_memory = _val_from_memory(s, load, va.get("step_ms_per_image"))
    if from_memory is not None:
        return "Inference checked: \"validation passes batches straight to the GPU\"", from_memory
    skipped = holds(s, "decoded_val") and holds(s, "augmented")
    text = f"Half right: {cost}." + claim(
        s, "decoded_val", " Validation images are still decoded, resized and normalised on the "
        "CPU" + ("; only the augmentation is skipped." if skipped else "."))
    if (va.get("images_per_s") or 0) > (tr.get("images_per_s") or 0):
        # the skipped augmentation explains a faster validation only where it was measured;
        # else the answer comparing the phases says what did (the forward pass alone)
        text += (" That is part of why validation is faster, not because anything skips the "
                 "CPU." if skipped else " Validation is faster for what it computes (see why "
                 "validation differs from training), not because anything skips the CPU.")
    return "Inference checked: \"validation passes batches straight to the GPU\"", text


def vram_inference(s: Summary) -> tuple[str, str] | None:
    mem = s.get("memory") or {}
    pool = mem.get("preallocated_pool")
    if not pool:
        return None
    text = (f"The {fmt_bytes(pool['pool_bytes'])} is none of the model's needs: {pool['why']}, so "
            "its size depends on the card's free memory, not on the model. That is why every "
            f"model takes the same amount. The fix: {pool['fix']}.")
    if mem.get("model_file_bytes"):
        text = f"{mem['footprint_line']}. " + text
    return "Why every model takes the same GPU memory", text


def what_to_do(s: Summary) -> tuple[str, str] | None:
    acts = [f for f in s.get("findings") or [] if f.get("severity") in ("high", "medium")]
    if not acts:
        return None
    lines = []
    for f in acts[:4]:
        line = f"{f['title']}. Fix: {f['fix']}."
        if f.get("expected_gain"):
            line += f" Expected: {f['expected_gain']}."
        if f.get("measure"):
            line += f" ({f['measure']}.)"
        lines.append(line)
    return "What to do", " ".join(lines)


_ANSWERS: tuple[Callable[[Summary], tuple[str, str] | None], ...] = (
    headline, epoch_one.answer, epoch_one.slower_answer, thaw.answer, train_vs_val,
    stages_answer, val_augmented_answer, augments_cached_answer, workers_answer, cold_vs_warm,
    budget.answer, cpu_pattern, gpu_pattern, memory_answer, val_inference, ram_inference,
    vram_inference, what_to_do,
)


def explain(summary: Summary) -> list[Answer]:
    """Numbered plain-words answers for a summary (see module doc for the order).

    Examples:
        >>> answers = explain(load_summary(Path("runs/demo")))
        >>> answers[0].title
        'Training was input-bound'
    """
    out: list[Answer] = []
    for make in _ANSWERS:
        got = make(summary)
        if got is not None:
            out.append(Answer(len(out) + 1, got[0], got[1]))
    return out
