"""Findings: what holds the run back, the numbers that show it, the fix, and the expected gain.

Each finding is ``{id, severity, title, evidence, fix, expected_gain, measure}``; ``severity`` is
``high`` | ``medium`` | ``low`` | ``info``. Gains are computed from the measured split, never
guessed: removing a part of the step leaves the others, so if the data wait (fraction ``d``) falls
to ``RESIDUAL_WAIT_FRAC`` of the new step, the step becomes (1 − d) / (1 − 0.10) of today's, a
speed-up of (1 − 0.10) / (1 − d).
"""

from __future__ import annotations

from collections.abc import Mapping

from stepscope import policy
from stepscope.analysis import budget, epoch_one
from stepscope.analysis.contracts import Finding, Severity, by_severity, make_finding
from stepscope.analysis.contracts_summary import (
    MemorySection,
    ModelFacts,
    PhaseAgg,
    PredictionRow,
    Summary,
)
from stepscope.analysis.evidence import claim, holds
from stepscope.analysis.fixes import capacity_fix, keras_stage_fix
from stepscope.analysis.fmt import (
    fmt_bytes,
    fmt_gain,
    fmt_pct,
    fmt_ratio,
    fmt_s,
    fmt_time,
    ms_of,
)
from stepscope.analysis.keras_spe import keras_steps_per_execution, keras_val_spe_fix
from stepscope.analysis.thaw import thawed
from stepscope.analysis.verdicts import BOUND_FRAC, INPUT_MODERATE_FRAC
from stepscope.analysis.vocab import (
    CACHE_CHANGE,
    HF,
    KERAS,
    PYTORCH,
    framework_of,
    keras_bf16_pays,
    keras_checkpoint_fix,
    keras_compute_fix,
    keras_cpu_fix,
    keras_decode_cache_fix,
    keras_moderate_wait_fix,
    keras_processes_fix,
    keras_receive_fix,
    keras_storage_fix,
    keras_workers_fix,
    phase_input,
    python_gil_held,
    vocab,
)

RESIDUAL_WAIT_FRAC = 0.10
GPU_LOW_PCT = 50.0
GPU_HIGH_PCT = 90.0
CHECKPOINT_SIGNIFICANT_FRAC = 0.02
MEASURE_TUNE = ("measure it: `stepscope tune` tries worker counts and batch sizes on this "
                "machine; or rerun and `stepscope compare` the two runs")
MEASURE_COMPARE = "measure it: rerun with the change and `stepscope compare` the two runs"


def _measure_input(summary: Summary | None) -> str:
    """How to measure an input fix: `stepscope tune` tries settings of `stepscope train` only;
    a watched script or a Monitor loop is rerun with the change."""
    run = summary.get("run") if summary is not None else None
    return MEASURE_TUNE if run is None or run.get("kind") in (None, "train") else MEASURE_COMPARE

_finding = make_finding  # every finding is built by the contract's constructor


def speedup_without(frac: float, residual: float = 0.0) -> float:
    """Speed-up if a part taking ``frac`` of the step shrinks to ``residual`` of the new step."""
    return (1.0 - residual) / max(1e-9, 1.0 - frac)


def _split_line(agg: PhaseAgg) -> str:
    return (f"a step took {ms_of(agg['step_ms_per_step'])}: "
            f"{ms_of(agg['data_wait_ms_per_step'])} waiting for data, "
            f"{ms_of(agg['transfer_ms_per_step'])} copying, "
            f"{ms_of(agg['compute_ms_per_step'])} computing, "
            f"{ms_of(agg['other_ms_per_step'])} other")


def _input_fix(agg: PhaseAgg, cores: float | None,
               summary: Summary | None) -> tuple[str, str, tuple[int, int, str] | None]:
    """(fix, short change label, (workers now, after, what they are called: "workers" or a
    tf.data pipeline's "parallel calls") where the fix is more of them) for the input cause, in
    the run's framework; figures and stages only as measured (``summary`` None:
    a bare aggregate, no framework known)."""
    loader = phase_input(summary.get("loader"), agg["phase"]) if summary else None
    # The claims look their measurements up by path; without a summary none holds.
    measured: Mapping[str, object] = summary or {}
    w = int(agg.get("workers") or 0)
    cause = agg["input_cause"]
    host = agg.get("cpu_util_pct")
    cores_busy = host is not None and host >= 90.0
    keras = summary is not None and loader is not None and framework_of(summary) == KERAS
    if keras and loader is not None and cause == "workers" and _processes_prediction(agg):
        # Measured on the threads themselves (analysis/causes.decide_threads_cause).
        return keras_processes_fix(loader, w), "use_multiprocessing=True", None
    if cause == "storage":
        if keras:
            return keras_storage_fix(), "faster storage", None
        return ("the loader waits on the disk: put the dataset on faster local storage or in RAM "
                "(it stays in the page cache after the first epoch if it fits), store smaller "
                "pre-resized files, or add workers so more reads are in flight", "faster storage",
                None)
    if keras and loader is not None and cause == "main-process":
        return keras_receive_fix(loader, w), KERAS_THREADS_CHANGE, None
    # Never more workers than the job's cores allow (policy.more_workers); unknown cores: 2.
    t = policy.more_workers(w, int(cores or 2))
    if keras and loader is not None and cause in ("workers", "cpu") and t is None \
            and loader.get("kind") == "tf.data" and python_gil_held(loader) is not None:
        # A map already at the job's cores (AUTOTUNE) whose Python holds the GIL runs its
        # calls one at a time: out of the GIL, the calls it has run side by side.
        return (keras_workers_fix(loader, w, w, agg["phase"]),
                f"the map's Python out of the GIL, {w} parallel calls", (1, w, "parallel calls"))
    if t is not None and (cause == "workers" or (cause == "cpu" and not cores_busy)):
        if keras and loader is not None:
            change, makers = f"workers {w} → {t}", "workers"
            if loader.get("kind") == "tf.data":
                makers = "parallel calls"
                if python_gil_held(loader) is not None:
                    change = f"the map's Python out of the GIL, {t} parallel calls"
            return keras_workers_fix(loader, w, t, agg["phase"]), change, (w, t, makers)
        words = vocab(framework_of(summary or {}))
        return (f"{words.more_workers.format(w=w, t=t)} so batches are ready when the step "
                "asks", f"workers {w} → {t}", (w, t, "workers"))
    if keras and loader is not None and agg["phase"] == "train" \
            and holds(measured, "tf_data_decodes"):
        images = agg["images"] // max(1, agg["phases"]) if agg.get("images") else None
        machine = summary.get("host") if summary is not None else None
        available = machine.get("mem_available_min_bytes") if machine else None
        return keras_decode_cache_fix(loader, images, available), CACHE_CHANGE, None
    if keras and loader is not None:
        model = summary.get("model") if summary is not None else None
        layers = model.get("augment_layers") if model else None
        return keras_cpu_fix(loader, agg["phase"], bool(layers)), (
            "decode once" if agg["phase"] == "val" else KERAS_CPU_CHANGE), None
    if agg["phase"] == "val" and holds(measured, "decoded_val"):
        return (claim(measured, "augmented", "validation does no augmentation: ")
                + "its CPU cost is decoding and resizing; cache the decoded, resized validation "
                "images once (for a frozen trunk, its features), or decode on the GPU",
                "decode once", None)
    if holds(measured, "scipy_augment_figures"):
        return ("the CPU preparing images is the limit (workers or cores saturated): make "
                "augmentation cheaper (one fused affine warp on uint8, ~1,400 img/s per core, "
                "instead of SciPy per channel in float32, ~130), augment on the GPU, decode once "
                "and cache resized images, or for a frozen trunk cache its features",
                "cheaper augmentation", None)
    cached = claim(measured, f"decoded_{agg['phase']}", ", decode once and cache resized images")
    return ("the CPU preparing batches is the limit (workers or cores saturated): make the "
            "dataset's per-item work cheaper (profile its __getitem__ and transforms), move "
            f"augmentation to the GPU{cached}, or for a frozen trunk cache its features",
            "cheaper per-item work", None)


def _processes_prediction(agg: PhaseAgg) -> PredictionRow | None:
    loader = agg.get("loader")
    if loader is None or not loader.get("threads_gil_bound"):
        return None
    return loader.get("processes_prediction")


def input_finding(agg: PhaseAgg, cores: float | None,
                  summary: Summary | None = None) -> Finding | None:
    """The data-wait finding for an aggregated phase kind (train or val); ``summary`` holds the
    measurements the fix's claims rest on (analysis/evidence.py)."""
    d = agg.get("data_wait_frac")
    if d is None or d < INPUT_MODERATE_FRAC:
        return None
    kind = "training" if agg["phase"] == "train" else "validation"
    evidence = [f"{fmt_pct(d)} of every {kind} step waited for data", _split_line(agg)]
    if agg.get("input_evidence"):
        evidence += list(agg["input_evidence"])
    if agg.get("verdict") != "input-bound":
        gain = speedup_without(d)
        fix = keras_moderate_wait_fix(phase_input(summary.get("loader"), agg["phase"]),
                                      agg["phase"], int(cores or 2)) \
            if summary is not None and framework_of(summary) == KERAS \
            else vocab(framework_of(summary or {})).moderate_wait_fix
        return _finding(f"input_wait_{agg['phase']}", "low",
                        f"{kind.capitalize()} waits for data {fmt_pct(d)} of the time",
                        evidence, fix,
                        f"at most {fmt_ratio(gain)} faster if the wait vanished",
                        _measure_input(summary))
    fix, change, spread = _input_fix(agg, cores, summary)
    gain, after = speedup_without(d, RESIDUAL_WAIT_FRAC), f"≤ {fmt_pct(RESIDUAL_WAIT_FRAC)}"
    why, faster = "", ""
    if spread is not None:
        # A batch's loading spread over t workers instead of w comes at most t/w as often (t is
        # within the job's cores): the new step is no shorter than the rest of the step, nor
        # than the wait times w/t. One loading thread 1 → 2 cannot promise the wait gone.
        w, t, makers = spread
        floor = max(1.0 - d, max(w, 1) * d / t)
        if 1.0 / floor < gain:
            gain, after = 1.0 / floor, f"~{fmt_pct(1.0 - (1.0 - d) / floor)}"
            why = f"; {t} {makers} make batches at most {fmt_ratio(t / max(w, 1))} as fast"
        # With no GPU the model computes on the cores that load: more loading work a second
        # fits only in what they left idle. An upper bound, so the whole idle share: the
        # capacity model's CPU_REACHABLE (95 %) read 1.90x where a DataLoader given 2 workers
        # ran 1.92x. A serial augmentation map given parallel calls on a job at 80-83 % of its
        # 2 cores, predicted 1.44x without the bound, ran 1.00-1.04x (docs/keras.md).
        busy = agg.get("job_cpu_pct")
        device = (summary.get("run") or {}).get("device") if summary is not None else None
        if device == "cpu" and busy and 100.0 / busy < gain:
            gain = 100.0 / busy
            after = f"≥ {fmt_pct(max(0.0, 1.0 - (1.0 - d) * gain))}"
            faster = f"at most {fmt_ratio(gain)} faster"
            why += (f"; the job used {busy:.0f} % of its cores, with the model on them too: at "
                    f"most {fmt_ratio(gain)} as much work fits")
    step = agg.get("step_ms_per_step")
    new_step = None if step is None else step / gain
    expected = (f"{change}: data wait {fmt_pct(d)} → {after}, {faster or fmt_gain(gain)} "
                f"(step {ms_of(step)} → {'≥ ' if faster else ''}{ms_of(new_step)}{why})")
    # The capacity model prices DataLoader changes; a Keras run keeps its own fix and the
    # split-based estimate (Keras's torch backend runs a DataLoader the script never sees).
    framework = framework_of(summary or {})
    priced = capacity_fix(agg, vocab(framework)) if framework != KERAS else \
        keras_stage_fix(agg) if change == KERAS_CPU_CHANGE \
        and _keras_kind(summary, agg) == "PyDataset" else None
    if priced is not None:
        fix, expected = priced
    gil = _processes_prediction(agg) if change == "use_multiprocessing=True" else None
    if gil is not None:
        expected = (f"{change}: predicted {fmt_ratio(gil['speedup'])} faster "
                    f"({gil['images_per_s']:.0f} img/s; {gil['basis']})")
    if agg["phase"] == "train" and summary is not None:
        expected += epoch_one.gain_scope(summary)
    if change == CACHE_CHANGE:
        expected += ", in the epochs after the first (the first decodes and fills the cache)"
    cause = agg.get("input_cause")
    title = f"{kind.capitalize()} is input-bound ({cause}): {fmt_pct(d)} of every step waits for data"
    severity: Severity = "high" if d >= BOUND_FRAC else "medium"
    if agg.get("verdict_weak"):
        severity, title = "low", f"{title} (tentative: {agg.get('verdict_note')})"
    return _finding(f"input_bound_{agg['phase']}", severity, title, evidence, fix, expected,
                    _measure_input(summary))


KERAS_CPU_CHANGE = "cheaper augmentation"  # training's loading CPU in a Keras run: no more workers
KERAS_THREADS_CHANGE = "worker threads, not processes"


def _keras_kind(summary: Summary | None, agg: PhaseAgg) -> str | None:
    loader = phase_input(summary.get("loader"), agg["phase"]) if summary else None
    return None if loader is None else loader.get("kind")


def other_bound_finding(agg: PhaseAgg, model: ModelFacts | None = None,
                        summary: Summary | None = None) -> Finding | None:
    """Transfer-, overhead- and compute-bound verdicts for an aggregated phase kind."""
    v = agg.get("verdict")
    words = vocab(framework_of(summary or {}))
    kind = "training" if agg["phase"] == "train" else "validation"
    if v == "transfer-bound":
        x = agg["transfer_frac"] or 0.0  # a verdict implies steady steps, so the split is set
        return _finding(f"transfer_bound_{agg['phase']}", "high",
                        f"{kind.capitalize()} is transfer-bound: {fmt_pct(x)} of every step copies "
                        "input to the device", [_split_line(agg)],
                        words.transfer_fix,
                        f"up to {fmt_ratio(speedup_without(x))} faster if the copy overlaps compute",
                        MEASURE_COMPARE)
    if v == "overhead-bound" and (ck := _checkpoints_inside(agg, summary)) is not None:
        return ck
    if v == "overhead-bound":
        o = agg["other_frac"] or 0.0
        spe = keras_steps_per_execution(agg, summary)
        fix = words.overhead_fix
        if summary is not None and holds(summary, "keras_other_is_loop"):
            fix = keras_val_spe_fix()  # validation's other: Keras's per-call Python
        return _finding(f"overhead_bound_{agg['phase']}", "medium",
                        f"{kind.capitalize()} is overhead-bound: {fmt_pct(o)} of every step is "
                        "loop overhead outside data, copy and compute",
                        [_split_line(agg), *(spe[2:] if spe else [])],
                        spe[0] if spe else fix,
                        spe[1] if spe else f"up to {fmt_ratio(speedup_without(o))} faster "
                                           "without it", MEASURE_COMPARE)
    if v == "compute-bound" and agg["phase"] == "train":
        return _finding("compute_bound_train", "info",
                        f"Training is compute-bound: {fmt_pct(agg['compute_frac'])} of every step "
                        "is the model's own work", [_split_line(agg)],
                        *_compute_fix(model, summary), MEASURE_COMPARE)
    return None


def _checkpoints_inside(agg: PhaseAgg, summary: Summary | None) -> Finding | None:
    """An overhead-bound phase kind whose loop overhead is mostly checkpoint writes made inside
    its steps (Keras's ModelCheckpoint(save_freq=N batches), a save every N steps): the fix is
    to write less often, not steps_per_execution or leaner logging."""
    written = budget.checkpoints_in_overhead(agg)
    if summary is None or written is None:
        return None
    inside, other_s = written
    if framework_of(summary) == KERAS:
        more = keras_checkpoint_fix((summary.get("checkpoints") or {}).get("keras"), then="")
        fix = ('ModelCheckpoint(save_freq="epoch") writes between epochs, not inside the '
               "steps (or a save_freq of many more batches)" + (f"; {more}" if more else ""))
    else:
        fix = ("save between epochs, or every many more steps, not inside the steps; "
               + vocab(framework_of(summary)).checkpoint_fix)
    kind = "training" if agg["phase"] == "train" else "validation"
    return _finding(f"overhead_bound_{agg['phase']}", "medium",
                    f"{kind.capitalize()} is overhead-bound: checkpoints written inside its "
                    f"steps took {fmt_s(inside)}, most of its loop overhead",
                    [_split_line(agg), f"checkpoint writes inside the {kind} phases: "
                     f"{fmt_s(inside)} of the {fmt_s(other_s)} outside data, copy and compute "
                     "(timed around each save)"],
                    fix, f"up to {fmt_ratio(speedup_without(inside / agg['seconds']))} faster "
                    f"without them", MEASURE_COMPARE)


def tf_eager_finding(agg: PhaseAgg, summary: Summary) -> Finding | None:
    """A TensorFlow loop written from scratch whose train step ran eagerly (watch counted its
    training steps with gradients computed outside any tf.function): the Keras guide's fix."""
    n = (summary.get("loader") or {}).get("tf_eager_train_steps")
    if not n or agg["phase"] != "train" or agg.get("verdict") == "input-bound":
        return None
    return _finding("tf_eager_train_step", "medium",
                    "The train step runs eagerly: TensorFlow executes it op by op from Python",
                    [f"{n} training steps computed their gradients with tf.GradientTape outside "
                     "any tf.function (watch)", _split_line(agg)],
                    "decorate the train step (and the test step) with @tf.function, as the Keras "
                    "guide's second version does: TensorFlow then runs each as one graph",
                    "three convolutions in the guide's loop ran 3.8× faster so on this 2-core "
                    "CPU (bench/tf_loop_function.py); measure it", MEASURE_COMPARE)


def keras_callback_finding(agg: PhaseAgg, summary: Summary) -> Finding | None:
    """Material per-call overhead on a Keras run that is bound by something else."""
    spe = keras_steps_per_execution(agg, summary)
    if spe is None or agg.get("verdict") == "overhead-bound":
        return None  # the overhead-bound finding carries the same fix
    what = ("Keras's loop outside TensorFlow's graph (callbacks, per-batch Python, the call's "
            "dispatch) takes" if holds(summary, "keras_loop_overhead")
            else "Keras batch callbacks take")
    return _finding("keras_callback_overhead_train", "low",
                    f"{what} {fmt_pct(agg['other_frac'])} of every training step",
                    [spe[2], _split_line(agg)], spe[0], spe[1], MEASURE_COMPARE)


def _frozen_until(model: ModelFacts, keras: bool) -> str:
    """The epochs the frozen-trunk advice is for, where a later epoch trained the trunk."""
    thaw = thawed(model, keras)
    return thaw.until_words() if thaw else ""


def _frozen(model: ModelFacts) -> bool | None:
    """The trunk frozen at the first training step (under half the parameters trainable)."""
    params, trainable = model.get("params"), model.get("trainable_params")
    return None if not params or trainable is None else trainable < 0.5 * params


def _compute_fix(model: ModelFacts | None, summary: Summary | None = None
                 ) -> tuple[str, str | None]:
    """What is left to try on a compute-bound run, leaving out what it already used."""
    model = model or {"name": None, "params": None, "trainable_params": None, "file_bytes": None,
                      "framework": None, "precision": None, "channels_last": None,
                      "trainable_by_fit": None, "augment_layers": None}
    frozen = _frozen(model)
    if summary is not None and framework_of(summary) == KERAS:
        loader = summary.get("loader") or {}
        pays = keras_bf16_pays((summary.get("host") or {}).get("bf16"),
                               loader.get("keras_backend"), (summary.get("run") or {}).get("device"))
        mixed = model.get("precision") in ("bf16", "fp16")
        layers = model.get("augment_layers") or []
        augments = True if layers else loader.get("augments")
        fix = keras_compute_fix(pays, mixed, frozen, augments,
                                _frozen_until(model, keras=True) if frozen else "", layers,
                                loader.get("augments_cached") is True)
        gain = ("mixed_bfloat16 ran three convolutions 1.9× faster under Keras on TensorFlow on "
                "a CPU with AMX (bench/keras_bf16.py); depthwise convolutions gained nothing: "
                "measure it" if pays and not mixed else None)
        return fix, gain
    # The feature cache only where the trunk was frozen (or its parameters were not counted).
    trunk = {None: "for a frozen trunk precompute its features once",
             False: "",
             True: f"with the trunk frozen ({model.get('trainable_params') or 0:,} of "
                   f"{model.get('params') or 0:,} parameters trainable) precompute its features "
                   f"once{_frozen_until(model, keras=False)}"}[frozen]
    framework = framework_of(summary) if summary is not None else PYTORCH
    hf, bf16 = framework == HF, vocab(framework).bf16
    layout = model.get("channels_last")
    # channels_last is an image model's (its 4-D input): offered only where an image batch was
    # read (watch reads the layout of a 4-D first training input; the trainer records its own)
    ways = [("bf16 autocast", bf16, model.get("precision") == "bf16")] + \
        ([] if layout is None else [("channels_last", "channels_last", layout is True)])
    tried = [name for name, _, used in ways if used]
    left = [how for _, how, used in ways if not used]
    if not tried:
        lead = (f"{bf16}, a larger per_device_train_batch_size" if hf
                else f"{' and '.join(left)}, a larger batch")
        return (lead + (f", or {trunk}" if trunk else ""),
                "bf16 measured 2.8× for InceptionResNetV2 on a CPU with AVX-512 BF16")
    cached = "" if frozen is False else ", or (frozen trunk, no augmentation) cached features"
    return (f"already uses {' and '.join(tried)}: {''.join(f'{w}, ' for w in left)}a larger "
            f"batch, a smaller input size, a lighter backbone{cached}; or a GPU", None)


def gpu_util_findings(by_phase: dict[str, PhaseAgg]) -> list[Finding]:
    """What NVML's utilization means for this run (a kernel was running, not 'busy')."""
    out: list[Finding] = []
    train, val = by_phase.get("train"), by_phase.get("val")
    g = None if not train else train.get("gpu_util_pct")
    if not train or g is None:
        return out
    evidence = [f"NVML utilization {g:.0f} % in training"]
    if val and (vg := val.get("gpu_util_pct")) is not None:
        evidence.append(f"{vg:.0f} % in validation")
    d = train.get("data_wait_frac")
    if d is not None:
        evidence.append(f"data wait {fmt_pct(d)} of each training step")
    evidence.append("NVML utilization is the share of time at least one kernel was running, "
                    "not how busy the GPU's cores were")
    if g < GPU_LOW_PCT:
        why = ("the GPU sat idle waiting for batches" if train.get("verdict") == "input-bound"
               else "kernels are short or the loop does other work between them")
        out.append(_finding("gpu_util_low", "medium" if d and d >= BOUND_FRAC else "low",
                            f"GPU ran kernels only {g:.0f} % of the training time: {why}",
                            evidence, "remove what bounds the step (the verdict's finding); the "
                            "GPU figure follows",
                            None, MEASURE_COMPARE))
    elif g >= GPU_HIGH_PCT:
        out.append(_finding("gpu_util_high", "info",
                            f"GPU utilization {g:.0f} %: a kernel was running nearly all the time",
                            evidence, "a larger batch or bf16 may still raise throughput: judge "
                            "by images/s, not by this figure", None, MEASURE_COMPARE))
    return out


def memory_findings(summary: Summary) -> list[Finding]:
    out: list[Finding] = []
    mem = summary.get("memory") or {}
    pool = mem.get("preallocated_pool")
    if pool:
        ev = [f"the process holds {fmt_bytes(pool['pool_bytes'])} of the GPU"]
        if pool.get("gpu_total_bytes"):
            ev.append(f"card {fmt_bytes(pool['gpu_total_bytes'])}")
        if mem.get("model_file_bytes"):
            ev.append(f"model file {fmt_bytes(mem['model_file_bytes'])}")
        out.append(_finding("gpu_preallocated_pool", "medium",
                            "GPU memory is a preallocated pool, not what the model needs",
                            [*ev, pool["why"]], pool["fix"],
                            "the real need shows with growth mode on; other processes can share "
                            "the card", MEASURE_COMPARE))
    frac = mem.get("unattributed_frac")
    if frac is not None and frac > (0.05 if str(mem.get("device", "")).startswith("cuda") else 0.10):
        out.append(_finding("memory_unattributed", "info",
                            f"{fmt_pct(frac)} of {fmt_bytes(mem['total_bytes'])} has no measured owner",
                            [f"unattributed {fmt_bytes(mem['unattributed_bytes'])}",
                             *(mem.get("notes") or [])],
                            _unattributed_fix(mem), None))
    return out


# The ledger items a run can measure; the fix names those this run did not (GPU: the context).
_LEDGER_ITEMS = ("weights", "gradients", "optimizer state", "saved for backward",
                 "forward transient peak")


def _unattributed_fix(mem: MemorySection) -> str:
    have = {i["item"] for i in mem.get("ledger") or []}
    wanted = [*_LEDGER_ITEMS, *(("CUDA context",) if str(mem.get("device", "")).startswith("cuda")
                                else ())]
    missing = [w for w in wanted if w not in have]
    if not missing:
        return ("every item this run can measure was measured; the rest is allocator caches, "
                "library buffers and memory no hook sees")
    return (f"not measured in this run: {', '.join(missing)}; the rest is allocator caches and "
            "library buffers")


def dataset_findings(summary: Summary) -> list[Finding]:
    """Page cache: a dataset larger than free RAM keeps the disk busy every epoch."""
    ds, host = summary.get("dataset") or {}, summary.get("host") or {}
    size, avail = ds.get("bytes"), host.get("mem_available_min_bytes")
    if not size or not avail or size <= avail:
        return []
    return [_finding("dataset_exceeds_ram", "medium",
                     "The dataset does not fit in free RAM: the page cache cannot hold it",
                     [f"dataset {fmt_bytes(size)}", f"available RAM as low as {fmt_bytes(avail)}"],
                     "every epoch reads from disk again: use faster storage, smaller files "
                     "(pre-resized), or more RAM", None, MEASURE_COMPARE)]


def checkpoint_findings(summary: Summary) -> list[Finding]:
    ck = summary.get("checkpoints") or {}
    run_s = (summary.get("run") or {}).get("seconds")
    if not ck.get("writes") or not run_s:
        return []
    frac = ck["total_s"] / run_s
    if frac < CHECKPOINT_SIGNIFICANT_FRAC:
        return []
    return [_finding("checkpoint_time", "low",
                     f"Checkpoint writes took {fmt_pct(frac)} of the run",
                     [f"{ck['writes']} writes, {fmt_s(ck['total_s'])} in all, "
                      f"longest {fmt_s(ck['max_s'])}"],
                     keras_checkpoint_fix(ck.get("keras")) if framework_of(summary) == KERAS
                     else vocab(framework_of(summary)).checkpoint_fix,
                     f"up to {fmt_pct(frac)} of the run",
                     MEASURE_COMPARE)]


def note_findings(summary: Summary) -> list[Finding]:
    out: list[Finding] = []
    phases = summary.get("phases") or []
    if not any(p.get("steps") for p in phases):
        out.append(_finding("no_steps", "info", "No training steps were recorded",
                            ["only system-level samples (CPU, memory, disk, GPU) exist"],
                            "wrap the loop with stepscope's monitor (`Monitor.step()`), or use "
                            "`stepscope train`, to get the step split and verdicts", None))
    weak = [p for p in phases if p.get("verdict_weak") and p.get("steps")]
    if weak:
        out.append(_finding("insufficient_steps", "info",
                            f"{len(weak)} phase(s) have a tentative verdict (few steps or near a threshold)",
                            [f"epoch {p['epoch']} {p['phase']}: {p.get('verdict_note')}" for p in weak[:4]],
                            "run more steps (a longer epoch) for firm verdicts", None))
    return out


MINOR_RUN_SHARE = 0.05  # a phase kind under 5 % of the run: its fix saves at most that


def _minor_phase(found: list[Finding], agg: PhaseAgg, summary: Summary) -> list[Finding]:
    """A phase kind that took a sliver of the run (a Trainer's 6 validation steps in 0.02 s of
    a 16 s run) keeps its findings, as information: whatever its own speed-up, the run gains at
    most the phase's time, and the evidence says so."""
    run_s, own = (summary.get("run") or {}).get("seconds"), agg.get("seconds")
    if not found or not run_s or own is None or own >= MINOR_RUN_SHARE * run_s:
        return found
    kind = "training" if agg["phase"] == "train" else "validation"
    line = (f"{kind} took {fmt_time(own)} of the run's {fmt_s(run_s)} ({fmt_pct(own / run_s)}): "
            "a fix saves the run at most that")
    return [make_finding(f["id"], "info", f["title"], [f["evidence"], line], f["fix"],
                         f["expected_gain"], f["measure"]) for f in found]


def build_findings(summary: Summary) -> list[Finding]:
    """All findings for a summary, most severe first."""
    by_phase = summary.get("by_phase") or {}
    cores = (summary.get("host") or {}).get("cores")
    out: list[Finding] = []
    for kind in ("train", "val"):
        agg = by_phase.get(kind)
        if agg:
            found = [f for f in (input_finding(agg, cores, summary), tf_eager_finding(agg, summary),
                                 other_bound_finding(agg, summary.get("model"), summary),
                                 keras_callback_finding(agg, summary)) if f]
            out += _minor_phase(found, agg, summary)
    out += gpu_util_findings(by_phase)
    out += memory_findings(summary)
    out += dataset_findings(summary)
    out += checkpoint_findings(summary)
    out += note_findings(summary)
    return by_severity(out)
