"""The memory ledger: where the bytes of the training process went, adding up to a measured total.

CPU runs: the total is the training process's RSS at its peak plus each DataLoader worker's USS
at that moment (USS, not RSS: forked workers share the parent's pages, and RSS would count those
twice). Items are the measured facts (weights, gradients, optimizer state, saved for backward,
forward transient peak, input batch, the framework's baseline, pinned memory), the batches in
flight in ``/dev/shm`` (host Shmem growth since the start) and every worker's USS; the rest is
shown as unattributed. On a GPU run the host ledger leaves out the device-resident tensors.

GPU runs: the total is NVML's per-process used memory at its peak = CUDA context + PyTorch's
allocator reserved memory + memory outside torch. Inside the allocator: the named tensors, the
other tensors at the allocation peak (``max_allocated`` − named: temporaries, cuBLAS/cuDNN
workspaces) and the cached-but-free blocks (reserved − ``max_allocated``). Whatever NVML counts
beyond context + reserved is unattributed.

Both totals are the peak inside the run's phases (first phase's start to last phase's end): the
ledger explains training's memory. A run without phases is read whole.

TensorFlow and JAX map nearly all free GPU memory at start; when the facts say so (or one
process holds nearly the whole card), the ledger names the preallocated pool and how to stop it.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.analysis.contracts import LedgerItem, ledger_item
from stepscope.analysis.contracts_summary import MemorySection, PoolInfo
from stepscope.analysis.fmt import fmt_bytes
from stepscope.analysis.samples import SampleCache, Series
from stepscope.analysis.vocab import vocab
from stepscope.store.records import Fact, PhaseRecord, ProcessInfo

HOST_UNATTRIBUTED_TARGET_FRAC = 0.10
GPU_UNATTRIBUTED_TARGET_FRAC = 0.05
POOL_FRAC_OF_CARD = 0.80  # one process holding ≥ 80 % of the card looks like a preallocated pool
NEAREST_GAP_S = 5.0
# A process's memory outside its phases (interpreter teardown, a final evaluation) is named in a
# note, not ledgered, when it tops the phases' peak by more than this.
OUTSIDE_PEAK_NOTE_RATIO = 1.1

_NAMED_ITEMS = (
    ("mem.weights_bytes", "weights", "parameters + buffers"),
    ("mem.gradients_bytes", "gradients", ".grad of trainable parameters"),
    ("mem.optimizer_bytes", "optimizer state", "optimizer state tensors after the first step"),
    ("mem.activations_peak_bytes", "saved for backward",
     "tensors autograd saved for backward in the first training forward"),
    ("mem.forward_transient_bytes", "forward transient peak",
     "first training step's peak above its start − saved for backward − gradients − optimizer "
     "state"),
    ("mem.input_batch_bytes", "input batch", "one input batch as it reaches the model"),
    ("mem.model_objects_bytes", "model objects beyond the weights",
     "RSS growth from the framework import to fit(), minus the weights"),
    ("mem.jax_start_bytes", "JAX starting: client, MLIR context, first compile",
     "RSS growth while JAX started at first use"),
    ("mem.jax_compiles_bytes", "JAX's compiled eager ops before fit()",
     "RSS growth over each XLA compile between JAX's start and fit()"),
    ("mem.tf_data_cache_bytes", "tf.data .cache() in memory",
     "the images the first pass put in the cache × each one's bytes there"),
    ("mem.before_loop_bytes", "the script's objects before its loop",
     "RSS growth from the framework import to the loop's first batch, minus the weights"),
    ("mem.first_step_bytes", "first training step: compiled step, activations, arenas",
     "RSS growth over the first training step, minus the optimizer state"),
    ("mem.refit_step_bytes", "later fits' first steps: step function compiled again",
     "RSS growth over each later fit()'s start and first training step (compile() dropped "
     "the train function)"),
)

_NAMED_NAMES = {name for _, name, _ in _NAMED_ITEMS}
# On a GPU run these live in device memory: the host ledger must not subtract them from RSS.
DEVICE_RESIDENT = {"mem.weights_bytes", "mem.gradients_bytes", "mem.optimizer_bytes",
                   "mem.activations_peak_bytes", "mem.forward_transient_bytes"}

POOL_FIXES = {
    "tensorflow": "set TF_FORCE_GPU_ALLOW_GROWTH=true (or tf.config.experimental."
                  "set_memory_growth(gpu, True)) to see the real need; cap it with "
                  "set_logical_device_configuration(..., memory_limit=MB)",
    "jax": "set XLA_PYTHON_CLIENT_PREALLOCATE=false (or lower XLA_PYTHON_CLIENT_MEM_FRACTION)",
}
POOL_FIX_WATCH = "`stepscope watch --no-preallocate -- CMD` sets both for you"


def _fact_int(facts: dict[str, Fact], key: str) -> int | None:
    f = facts.get(key)
    if f is None or f.value is None:
        return None
    try:
        return int(f.value)
    except (TypeError, ValueError):
        return None


_item = ledger_item  # every ledger item is built by the contract's constructor


def _named_items(facts: dict[str, Fact], *, host_of_gpu_run: bool = False
                 ) -> list[LedgerItem]:
    out = []
    for key, name, default_how in _NAMED_ITEMS:
        if host_of_gpu_run and key in DEVICE_RESIDENT:
            continue
        n = _fact_int(facts, key)
        if n is not None:
            out.append(_item(name, n, facts[key].how_measured or default_how))
    return out


def _close(total: int | None, items: list[LedgerItem], device: str,
           notes: list[str], target: float) -> MemorySection:
    """Close the ledger: unattributed = total − items, so the items + rest equal the total."""
    unattributed = None if total is None else total - sum(i["bytes"] for i in items)
    frac = unattributed / total if unattributed is not None and total else None
    if frac is not None and frac > target:
        notes.append(f"unattributed {frac * 100:.0f} % of the total, above the {target * 100:.0f} % "
                     "target: some memory has no measured owner")
    if total is not None and not any(i["item"] in _NAMED_NAMES for i in items):
        notes.append("no model memory facts were recorded (weights, gradients, activations...): "
                     "`stepscope train` measures them; a watched or monitored loop may not")
    if unattributed is not None and unattributed < 0:
        notes.append("the named items exceed the measured total: they were not all live at the peak")
    return {"device": device, "total_bytes": total, "ledger": items,
            "unattributed_bytes": unattributed, "unattributed_frac": frac, "notes": notes}


@dataclass(frozen=True)
class _HostPeak:
    """The moment main RSS + workers' USS peaked. Each figure comes with the width of the
    roll-up slice it was read from as that slice's highest sample (the run's older samples are
    kept only per slice: mean, lowest, highest), None where it is a raw sample."""

    t: float
    main_rss: float
    main_slice_s: float | None
    workers: list[tuple[int, float, float | None]]  # (pid, USS, roll-up slice width)
    slice_lo: float
    slice_hi: float

    @property
    def rolled(self) -> bool:
        return self.main_slice_s is not None or any(w is not None for _, _, w in self.workers)


def _worker_uss_at(cache: SampleCache, workers: list[ProcessInfo], lo: float, hi: float,
                   t: float) -> list[tuple[int, float, float | None]]:
    """Each live worker's USS at ``t`` (a raw instant: lo == hi == t), or its highest in the
    roll-up slice lo <= t < hi: in a rolled-up stretch the instant is no longer known."""
    out = []
    for w in workers:
        uss = cache.peak(f"proc:{w.pid}", "uss_bytes")
        if lo == hi:
            # first_t/last_t are sample times, so a worker alive at a sample lies inside them.
            i = uss.nearest_index(t, NEAREST_GAP_S) if w.first_t <= t <= w.last_t else None
        else:
            i = uss.argmax_in(lo, hi) if w.first_t < hi and w.last_t >= lo else None
        if i is not None:
            out.append((w.pid, uss.v[i], uss.slice_s(i)))
    return out


Window = tuple[float, float]


def phases_window(phases: list[PhaseRecord]) -> Window | None:
    """From the first phase's start to the last one's end (open-ended while a phase is open)."""
    if not phases:
        return None
    ends = [p.ended for p in phases]
    last = max(e for e in ends if e is not None) if all(e is not None for e in ends) else None
    return (min(p.started for p in phases), float("inf") if last is None else last)


def _inside(series: Series, i: int, window: Window | None) -> bool:
    """Whether point i's slice overlaps the window (the run's phases)."""
    if window is None:
        return True
    lo, hi = series.slice_at(i)
    return hi >= window[0] and lo <= window[1]


def _host_peak(cache: SampleCache, main_pid: int | None, workers: list[ProcessInfo],
               window: Window | None = None) -> _HostPeak | None:
    """The moment main RSS + workers' USS peaked inside the window (see :class:`_HostPeak`)."""
    rss = cache.peak(f"proc:{main_pid}", "rss_bytes") if main_pid else Series([], [])
    best: _HostPeak | None = None
    best_total = -1.0
    for i, (t, v) in enumerate(zip(rss.t, rss.v, strict=True)):
        if not _inside(rss, i, window):
            continue
        lo, hi = rss.slice_at(i)
        ws = _worker_uss_at(cache, workers, lo, hi, t)
        total = v + sum(u for _, u, _ in ws)
        if total > best_total:
            best, best_total = _HostPeak(t, v, rss.slice_s(i), ws, lo, hi), total
    return best


def host_ledger(cache: SampleCache, main_pid: int | None, processes: list[ProcessInfo],
                facts: dict[str, Fact], *, gpu_run: bool = False,
                window: Window | None = None) -> MemorySection:
    """The CPU-side ledger (see module doc); on a GPU run the device-resident tensors (weights,
    gradients, optimizer state, activations) are left to the GPU ledger. ``window``: the
    phases' span, where the peak is looked for (see :func:`phases_window`)."""
    workers = [p for p in processes if p.role == "worker"]
    peak = _host_peak(cache, main_pid, workers, window) or _host_peak(cache, main_pid, workers)
    notes: list[str] = []
    whole = _host_peak(cache, main_pid, workers) if window is not None and peak else None
    if window and peak and whole and whole.main_rss > OUTSIDE_PEAK_NOTE_RATIO * peak.main_rss:
        when = "after the last phase" if whole.t > window[1] else "before the first phase"
        notes.append(f"the process's RSS reached {fmt_bytes(whole.main_rss)} {when} (main-process "
                     f"RSS samples): the ledger is the phases' peak, {fmt_bytes(peak.main_rss)}")
    if peak is None:
        tree = cache.peak("tree", "rss_bytes").max()
        notes.append("no per-process memory samples: total is the process tree's RSS (shared "
                     "pages counted once per process)" if tree else "no process memory recorded")
        total = None if tree is None else int(tree)
        return _close(total, _named_items(facts, host_of_gpu_run=gpu_run), "cpu", notes,
                      HOST_UNATTRIBUTED_TARGET_FRAC)
    items = []
    base = _fact_int(facts, "mem.runtime_baseline_bytes")
    if base is not None:
        items.append(_item("framework/runtime baseline", base, facts["mem.runtime_baseline_bytes"]
                           .how_measured or "process memory after importing the framework"))
    items += _named_items(facts, host_of_gpu_run=gpu_run)
    pinned = _fact_int(facts, "mem.pinned_bytes")
    if pinned:
        items.append(_item("pinned memory", pinned, facts["mem.pinned_bytes"].how_measured
                           or "pinned host memory (CUDA caching host allocator)"))
    if workers:
        items += _shm_item(cache, peak)
    summed = len(peak.workers) > 0 and peak.rolled
    for i, (pid, uss, slice_s) in enumerate(peak.workers, 1):
        how = f"USS of worker pid {pid} (smaps_rollup)"
        if slice_s is not None:
            how = (f"highest {how} in the {slice_s:.0f}-s roll-up slice of the peak (samples "
                   "that old are kept only as each slice's mean, lowest and highest); the "
                   "total adds each process's highest of the slice: an upper bound")
        items.append(_item(f"{_worker_word(facts)} {i}", uss, how))
    if summed:
        notes.append(upper_bound_note(
            max(w for w in (peak.main_slice_s, *(s for _, _, s in peak.workers)) if w),
            "main RSS's and each worker's highest USS"))
    total = int(peak.main_rss + sum(u for _, u, _ in peak.workers))
    ledger = _close(total, items, "cpu", notes, HOST_UNATTRIBUTED_TARGET_FRAC)
    ledger["peak_t"] = peak.t
    ledger["main_rss_bytes"] = int(peak.main_rss)
    if summed:
        ledger["total_upper_bound"] = True
    return ledger


def upper_bound_note(slice_s: float, what: str) -> str:
    """Why a peak read from a rolled-up slice, summed over processes, is an upper bound."""
    return (f"the peak lies in the run's rolled-up part (samples older than the raw window are "
            f"kept only as each {slice_s:.0f}-s slice's mean, lowest and highest): the total "
            f"adds {what} in that slice, an upper bound, since they need not have peaked at "
            "the same instant")


def _shm_item(cache: SampleCache, peak: _HostPeak) -> list[LedgerItem]:
    """/dev/shm batches: host Shmem at the peak (its slice's highest, in a rolled-up part)
    minus at the start."""
    shm = cache.get("host", "mem_shmem_bytes")
    if not shm:
        return []
    how = "host Shmem at the peak − at the start (/dev/shm batches from workers)"
    if peak.main_slice_s is None:
        at_peak = shm.nearest(peak.t, NEAREST_GAP_S)
    else:
        at_peak = cache.peak("host", "mem_shmem_bytes").max_in(peak.slice_lo, peak.slice_hi)
        how = (f"highest host Shmem in the {peak.main_slice_s:.0f}-s roll-up slice of the peak "
               "− at the start (/dev/shm batches from workers)")
    if at_peak is None or at_peak <= shm.v[0]:
        return []
    return [_item("shared memory for batches", at_peak - shm.v[0], how)]


def _worker_word(facts: dict[str, Fact]) -> str:
    loop = facts.get("loop.framework")
    keras = loop is not None and loop.value in ("keras", "tf.keras")
    return vocab("keras" if keras else None).worker


@dataclass(frozen=True)
class _GpuPeak:
    """The peak of NVML per-process used memory summed over the run's processes. ``slice_s``:
    the width of the roll-up slice it was read from (as that slice's highest), None if raw;
    ``summed_bound``: several processes' slice maxima were added (an upper bound)."""

    t: float
    used: float
    slice_lo: float
    slice_hi: float
    slice_s: float | None
    summed_bound: bool


def _gpu_used_peak(cache: SampleCache, gpu: int, pids: set[int],
                   window: Window | None = None) -> _GpuPeak | None:
    """See :class:`_GpuPeak`; the peak is looked for inside the window."""
    prefix = f"gpu{gpu}:proc:"
    sources = [s for s in cache.sources("mem_used_bytes") if s.startswith(prefix)]
    if pids:
        sources = [s for s in sources if s[len(prefix):].isdigit() and int(s[len(prefix):]) in pids]
    series = [cache.peak(s, "mem_used_bytes") for s in sources]
    series = [s for s in series if s]
    if not series:
        return None
    lead = max(series, key=lambda s: max(s.v))
    best: _GpuPeak | None = None
    for i, (t, v) in enumerate(zip(lead.t, lead.v, strict=True)):
        if not _inside(lead, i, window):
            continue
        lo, hi = lead.slice_at(i)
        others = [(s, s.nearest_index(t, NEAREST_GAP_S) if lo == hi else s.argmax_in(lo, hi))
                  for s in series if s is not lead]
        found = [(s, j) for s, j in others if j is not None]
        total = v + sum(s.v[j] for s, j in found)
        if best is None or total > best.used:
            rolled = lead.rolled(i) or any(s.rolled(j) for s, j in found)
            width = lead.slice_s(i) or max((s.slice_s(j) or 0.0 for s, j in found), default=0.0)
            best = _GpuPeak(t, total, lo, hi, width or None, rolled and bool(found))
    return best


def detect_pool(framework: str | None, used: float, card_total: float | None) -> PoolInfo | None:
    """A preallocated pool: TF/JAX on a GPU, or one process holding nearly the whole card."""
    fw = (framework or "").lower()
    near_card = card_total is not None and card_total > 0 and used >= POOL_FRAC_OF_CARD * card_total
    if fw not in POOL_FIXES and not near_card:
        return None
    fix = POOL_FIXES.get(fw, POOL_FIXES["tensorflow"] + "; for JAX " + POOL_FIXES["jax"])
    why = ("TensorFlow's BFC allocator maps nearly all free GPU memory at start (free − a reserve)"
           if fw != "jax" else "JAX preallocates 75 % of the GPU's memory at start")
    return {"framework": fw or None, "pool_bytes": int(used), "gpu_total_bytes": card_total,
            "why": why, "fix": f"{fix}; {POOL_FIX_WATCH}"}


def gpu_ledger(cache: SampleCache, gpu: int, pids: set[int], facts: dict[str, Fact],
               window: Window | None = None) -> MemorySection:
    """The GPU-side ledger (see module doc), its peak looked for inside the window."""
    device = f"cuda:{gpu}"
    notes: list[str] = []
    peak = _gpu_used_peak(cache, gpu, pids, window) or _gpu_used_peak(cache, gpu, pids)
    if peak is None:
        notes.append("no NVML per-process memory samples: the GPU total is unknown")
        return _close(None, _named_items(facts), device, notes, GPU_UNATTRIBUTED_TARGET_FRAC)
    used = peak.used
    fw_fact = facts.get("mem.framework")
    framework = str(fw_fact.value).lower() if fw_fact and fw_fact.value else None
    card = cache.peak(f"gpu{gpu}", "mem_total_bytes").max()
    pool = detect_pool(framework, used, card)
    context = _fact_int(facts, "mem.cuda_context_bytes")
    items: list[LedgerItem] = []
    if context is not None:
        items.append(_item("CUDA context", context, facts["mem.cuda_context_bytes"].how_measured
                           or "NVML per-process used − allocator reserved, at start"))
    torch_src = f"torch:cuda{gpu}"
    reserved_how = "allocator reserved"
    if peak.slice_s is None or peak.slice_lo == peak.slice_hi:
        reserved = cache.get(torch_src, "reserved_bytes").nearest(peak.t, NEAREST_GAP_S)
    else:
        # The peak is a roll-up slice's highest: reserved's highest in the same slice.
        reserved = cache.peak(torch_src, "reserved_bytes").max_in(peak.slice_lo, peak.slice_hi)
        reserved_how = (f"highest allocator reserved in the {peak.slice_s:.0f}-s roll-up slice "
                        "of the peak")
    if reserved is not None and framework not in POOL_FIXES:
        items += _allocator_items(cache, torch_src, reserved, facts, reserved_how)
    elif pool is not None:
        items += _pool_items(used - (context or 0), framework, facts, pool["why"])
    if peak.summed_bound and peak.slice_s is not None:
        notes.append(upper_bound_note(peak.slice_s,
                                      "each process's highest NVML used memory"))
    ledger = _close(int(used), items, device, notes, GPU_UNATTRIBUTED_TARGET_FRAC)
    ledger["peak_t"] = peak.t
    ledger["gpu_total_bytes"] = card
    show_pool = pool is not None and (framework in POOL_FIXES or reserved is None)
    ledger["preallocated_pool"] = pool if show_pool else None
    if peak.summed_bound:
        ledger["total_upper_bound"] = True
    return ledger


# What TensorFlow's and JAX's own allocators say they held at their peak (watch's Keras hook).
_POOL_PEAK_FACTS = {"tensorflow": "mem.tf_gpu_peak_bytes", "jax": "mem.jax_peak_bytes"}


def _pool_items(pool_bytes: float, framework: str | None, facts: dict[str, Fact],
                why: str) -> list[LedgerItem]:
    """The preallocated pool, split into the tensors the framework's allocator held at its
    peak and the rest of the pool (reserved, never used), where the allocator said so."""
    key = _POOL_PEAK_FACTS.get(framework or "")
    peak = _fact_int(facts, key) if key else None
    if peak is None or peak > pool_bytes:
        return [_item("preallocated pool", pool_bytes, "NVML per-process used − CUDA context: "
                      + why)]
    assert key is not None
    return [_item(f"{framework} tensors at their peak", peak, facts[key].how_measured
                  or "the framework allocator's peak"),
            _item("preallocated pool, never used", pool_bytes - peak,
                  "NVML per-process used − CUDA context − the allocator's peak: " + why)]


def _allocator_items(cache: SampleCache, src: str, reserved: float,
                     facts: dict[str, Fact], reserved_how: str) -> list[LedgerItem]:
    named = [i for i in _named_items(facts) if i["item"] != "forward transient peak"]
    step_peak = _fact_int(facts, "mem.cuda_step_peak_bytes")
    if step_peak is not None:
        # The step's allocator peak above its start, less what the step leaves allocated.
        left = sum(i["bytes"] for i in named
                   if i["item"] in ("saved for backward", "gradients", "optimizer state"))
        named.append(_item("forward transient peak", max(step_peak - left, 0),
                           "first training step's allocator peak (max_memory_allocated) above its "
                           "start − saved for backward − gradients − optimizer state"))
    named_sum = sum(i["bytes"] for i in named)
    max_alloc = cache.peak(src, "max_allocated_bytes").max()
    if max_alloc is None:
        max_alloc = cache.peak(src, "allocated_bytes").max() or 0.0
    max_alloc = min(max_alloc, reserved)
    items = list(named)
    if max_alloc > named_sum:
        items.append(_item("other tensors at the allocation peak", max_alloc - named_sum,
                           "max_allocated − the named items: temporaries, cuBLAS/cuDNN workspaces"))
    items.append(_item("cached but free", max(0.0, reserved - max(max_alloc, named_sum)),
                       f"{reserved_how} − max_allocated: blocks PyTorch keeps for reuse"))
    return items


def footprint_line(model_file_bytes: int | None, total_bytes: int | None) -> str | None:
    """'549 MB model, 6.5 GB used' — the weight file beside the training footprint."""
    if model_file_bytes is None or total_bytes is None:
        return None
    return f"{fmt_bytes(model_file_bytes)} model, {fmt_bytes(total_bytes)} used"
