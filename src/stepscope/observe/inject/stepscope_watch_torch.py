"""PyTorch hooks for ``stepscope watch``, installed right after ``import torch`` finishes.

They report what the loop does to a :class:`LoopTracker` (``stepscope_watch_loop``), which
decides steps, phases and epochs from it (see that module for the rules):

- ``DataLoader.__iter__`` creates a tracked iterator; ``_BaseDataLoaderIter.__next__`` is timed
  per call. A DataLoader subclass that overrides ``__iter__`` (timm's ``MultiEpochsDataLoader``,
  which keeps one iterator for all epochs) and Accelerate's wrapping loaders
  (``DataLoaderShard`` fetches one batch ahead; :func:`install_accelerate`) are timed at *their*
  iterator instead, the one the loop sees; the inner iterator's calls are then part of that
  wait, not steps of their own.
- body events: a global optimizer step post-hook, ``torch.autograd.backward`` (what
  ``Tensor.backward`` calls), and a global forward pre-hook armed only between a batch's arrival
  and the first forward (removed at once, so models run without it the rest of the step).
- ``Tensor.to``/``Tensor.cuda`` to a non-CPU device during a step: transfer time.
- at the first optimizer step (inside Lightning's loop too), the memory-ledger facts (weights, gradients, optimizer state) and
  the step's peak: host VmHWM (reset through ``/proc/self/clear_refs`` at the first batch's
  arrival) and, on CUDA, the allocator's peak over the same span; and, once, what autograd
  saved for backward in the first training forward (saved-tensor hooks from the batch's arrival
  to its backward, :class:`_SavedForBackward`).
- CUDA allocator figures once a second at a step boundary, and CUDA timing events, only once the
  program itself has initialised CUDA (reading them never synchronises and never creates a
  context).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_loop import IterState, LoopTracker
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder

TORCH_STATS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "allocated_bytes.all.peak": "max_allocated_bytes",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
}
_STATE = "_stepscope_iter"


def install(torch: ModuleType, rec: Recorder, count_images: Callable[[Any], int],
            loop_module: ModuleType) -> LoopTracker:
    """Patch ``torch`` in place so that ``rec`` sees its loops; returns the loop tracker."""
    loop: LoopTracker = loop_module.LoopTracker(
        rec, events=lambda: _cuda_event(torch), hint=loop_module.hint_from_env(),
        mode_kind=lambda hint: _phase_now(torch, rec, hint),
        compiles=loop_module.dynamo_compiles)
    setattr(loop_module, "ACTIVE", loop)  # noqa: B010 (a module attribute mypy cannot see)
    rec.at_exit_hooks.append(loop.flush)
    runtime_baseline(rec, "torch")
    peak = _StepPeak(torch, rec, _SavedForBackward(torch, rec))
    rec.train_batch_arrived = peak.batch_arrived  # a framework loop's training batch (Lightning)
    _patch_loader(torch, rec, loop, count_images, loop_module.IterState, peak)
    _patch_module_mode(torch, rec)
    _patch_transfers(torch, rec, loop)
    _hook_body(torch, rec, loop, peak)
    rec.periodic.append(lambda: _cuda_memory(torch, rec))
    _hook_cuda_init(torch, rec)
    # checkpoints, written between steps and phases
    setattr(torch, "save", rec.timed_save(torch.save))  # noqa: B010 (mypy: ModuleType)
    return loop


def runtime_baseline(rec: Recorder, module: str, above: str = "") -> None:
    """The ledger's framework baseline: RSS once ``module`` finished importing. A framework
    imported on top of torch (Lightning: ~280 MB more RSS) sends it again, naming what it
    ``above``; the store keeps the last one, which covers both."""
    baseline = _status_bytes("VmRSS")
    if baseline is not None:
        rec.fact("mem.runtime_baseline_bytes", baseline,
                 f"watch: the process's RSS when `import {module}` finished (interpreter, "
                 f"{above}{module} and what the script imported before it)")


def _phase_now(torch: ModuleType, rec: Recorder, hint: str) -> str:
    """The phase by the hint's rule: ``grad`` (grad disabled is val) or ``mode`` (also the last
    outermost ``Module.train(False)``)."""
    grad_off = not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
    if hint == "grad":
        return "val" if grad_off else "train"
    return "val" if grad_off or rec.last_mode_eval else "train"


def _cuda_event(torch: ModuleType) -> Any:
    """A recorded timing event on the current stream, or None while CUDA is not in use."""
    if not torch.cuda.is_initialized():
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _watching(rec: Recorder) -> bool:
    # Inside Keras/Lightning loops their callbacks time the steps; a forked worker never reports.
    return rec.framework_depth == 0 and rec.owner()


def _patch_loader(torch: ModuleType, rec: Recorder, loop: LoopTracker,
                  count_images: Callable[[Any], int], iter_state: type[IterState],
                  peak: _StepPeak) -> None:
    dl = torch.utils.data.dataloader
    orig_iter = dl.DataLoader.__iter__
    orig_next = dl._BaseDataLoaderIter.__next__
    outer = {"depth": 0}  # > 0 inside a subclass iterator's __next__: it is the one timed
    forward = _ForwardSignal(torch, rec, loop)

    def track(loader: Any, it: Any, t0: float) -> None:
        with contextlib.suppress(Exception):  # discovery is a nicety
            rec.dataset_files(loader.dataset)
        persistent = getattr(loader, "persistent_workers", None)
        state = iter_state(id(loader), t0, rec.clock() - t0, getattr(loader, "num_workers", None),
                           None if persistent is None else bool(persistent))
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(it, _STATE, state)

    def timed_next(it: Any, call: Callable[[], Any]) -> Any:
        state = getattr(it, _STATE, None)
        if state is None or outer["depth"] or not _watching(rec):
            return call()
        loop.next_begin(state, rec.clock())
        outer["depth"] += 1
        cpu0 = time.thread_time()  # the loading thread's own CPU while the loop waits
        try:
            batch = call()
        except StopIteration:
            loop.next_stop(state, rec.clock())
            raise
        finally:
            outer["depth"] -= 1
            if rec.stages is not None:
                rec.stages.wait_cpu_s += time.thread_time() - cpu0
        t = rec.clock()
        loop.next_end(state, t, count_images(batch))
        peak.batch_arrived()
        if loop.wants_body():
            forward.arm()
        return batch

    def __iter__(self: Any) -> Any:
        t0 = rec.clock()
        it = orig_iter(self)
        if _watching(rec) and not outer["depth"]:
            track(self, it, t0)
        return it

    def __next__(self: Any) -> Any:
        return timed_next(self, lambda: orig_next(self))

    class OuterIter:
        """The iterator a DataLoader subclass's own ``__iter__`` returns, timed per batch."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __iter__(self) -> OuterIter:
            return self

        def __next__(self) -> Any:
            return timed_next(self, lambda: next(self._inner))

        def __getattr__(self, name: str) -> Any:  # send/close/throw of a generator, and more
            return getattr(self._inner, name)

    def wrap_subclass_iter(own: Callable[..., Any]) -> Callable[..., Any]:
        def __iter__(self: Any) -> Any:
            t0 = rec.clock()
            outer["depth"] += 1  # its constructor-time or inner DataLoader.__iter__ is not a loop
            try:
                inner = own(self)
            finally:
                outer["depth"] -= 1
            if not _watching(rec) or outer["depth"]:
                return inner
            proxy = OuterIter(inner)
            track(self, proxy, t0)
            return proxy

        __iter__._stepscope = True  # type: ignore[attr-defined]
        return __iter__

    base_init_subclass = dl.DataLoader.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if base_init_subclass is not None:
            base_init_subclass.__func__(cls, **kwargs)
        else:
            super(dl.DataLoader, cls).__init_subclass__(**kwargs)
        own = cls.__dict__.get("__iter__")
        if own is not None and not getattr(own, "_stepscope", False):
            cls.__iter__ = wrap_subclass_iter(own)  # type: ignore[attr-defined]

    loop.wrap_iter = wrap_subclass_iter
    dl.DataLoader.__iter__ = __iter__
    dl.DataLoader.__init_subclass__ = classmethod(__init_subclass__)
    dl._BaseDataLoaderIter.__next__ = __next__


ACCELERATE_LOADERS = ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader")


def install_accelerate(module: ModuleType, loop: LoopTracker) -> None:
    """Accelerate's loaders wrap a DataLoader instead of subclassing it (they only fake
    ``__class__``) and ``DataLoaderShard`` fetches one batch ahead: time *their* iterators, or
    the last batch's step would fall after the inner loader's ``StopIteration``."""
    wrap = loop.wrap_iter
    if wrap is None:
        return
    for name in ACCELERATE_LOADERS:
        cls = getattr(module, name, None)
        own = None if cls is None else cls.__dict__.get("__iter__")
        if own is not None and not getattr(own, "_stepscope", False):
            setattr(cls, "__iter__", wrap(own))  # noqa: B010 (a class attribute, on purpose)


class _ForwardSignal:
    """A global forward pre-hook that fires once: the first module call after a batch arrives
    tells the tracker the body ran. It removes itself at once, so the model runs the rest of
    the step without a global hook; at most one is armed at a time."""

    def __init__(self, torch: ModuleType, rec: Recorder, loop: LoopTracker) -> None:
        self.register = torch.nn.modules.module.register_module_forward_pre_hook
        self.rec, self.loop = rec, loop
        self.handle: Any = None

    def arm(self) -> None:
        if self.handle is None:
            self.handle = self.register(self._fire)

    def _fire(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self.rec.main_thread_id:
            return
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()
        self.loop.body("forward", self.rec.clock())


def _patch_module_mode(torch: ModuleType, rec: Recorder) -> None:
    orig_train = torch.nn.Module.train

    def train(self: Any, mode: bool = True) -> Any:
        # Only the outermost call counts: Module.train recurses into every child. It no longer
        # decides the phase (the optimizer step does); it finds the model for the ledger and
        # serves --phase-hint mode.
        if rec.train_depth == 0:
            rec.last_mode_eval = not mode
            with contextlib.suppress(TypeError):  # not weak-referenceable
                rec.roots.add(self)
        rec.train_depth += 1
        try:
            return orig_train(self, mode)
        finally:
            rec.train_depth -= 1

    torch.nn.Module.train = train


def _patch_transfers(torch: ModuleType, rec: Recorder, loop: LoopTracker) -> None:
    tensor = torch.Tensor
    main_id = rec.main_thread_id

    def timed(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Outside a step, or off the main thread (pin-memory thread), it is not the loop's.
            if threading.get_ident() != main_id or (rec.step is None and not loop.in_step()):
                return orig(self, *args, **kwargs)
            ev0 = _cuda_event(torch)
            t0 = rec.clock()
            out = orig(self, *args, **kwargs)
            dt = rec.clock() - t0
            device = getattr(out, "device", None)
            if out is not self and device is not None and device.type != "cpu" \
                    and device != self.device:
                if rec.step is not None:
                    rec.add_transfer(dt)
                else:
                    ev1 = _cuda_event(torch)
                    loop.transfer(dt, None if ev0 is None or ev1 is None else (ev0, ev1))
                if rec.once("device"):
                    rec.send(["R", str(device)])
            return out

        wrapper.__name__ = getattr(orig, "__name__", "to")
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        return wrapper

    tensor.to = timed(tensor.to)
    tensor.cuda = timed(tensor.cuda)


def _hook_body(torch: ModuleType, rec: Recorder, loop: LoopTracker, peak: _StepPeak) -> None:
    def post_step(opt: Any, args: Any, kwargs: Any) -> None:
        if not rec.owner():
            return
        if _watching(rec):
            t = rec.clock()
            rec.optimizer_stepped(t)
            loop.body("optimizer", t)
        # The ledger is the model's wherever its loop lives: inside Lightning's (framework_depth
        # > 0) the same torch.optim step is the first moment the optimizer state exists.
        if rec.once("ledger"):
            left = _ledger_facts(opt, rec)
            peak.first_optimizer_step(left)

    # torch.optim.optimizer is loaded by `import torch` but not bound as an attribute.
    importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(post_step)
    orig_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        if not peak.saved.done and threading.get_ident() == rec.main_thread_id:
            peak.saved.backward()  # the forward is over: what it saved is counted
        out = orig_backward(*args, **kwargs)
        if _watching(rec) and threading.get_ident() == rec.main_thread_id:
            loop.body("backward", rec.clock())
        return out

    backward.__doc__ = orig_backward.__doc__
    torch.autograd.backward = backward


class _SavedForBackward:
    """Bytes autograd saved for backward in the first training forward, as ``stepscope train``
    counts them (``train/memory.py``): a pack hook (``saved_tensors_hooks``) notes each saved
    tensor's storage once by its address; unpack hands the tensor back unchanged. The hooks are
    pushed at a batch's arrival and popped at its backward; a batch that reaches no backward
    (validation, a probe) is discarded and the next one measured. After the first backward no
    hook is pushed again, so the steps after it run exactly as without watch.
    """

    def __init__(self, torch: ModuleType, rec: Recorder) -> None:
        self.torch, self.rec = torch, rec
        self.seen: dict[int, int] = {}
        self.hooks: Any = None
        self.done = False
        self.bytes: int | None = None

    def _pack(self, t: Any) -> Any:
        with contextlib.suppress(Exception):  # a tensor without storage (sparse, nested...)
            storage = t.untyped_storage()
            self.seen[int(storage.data_ptr())] = int(storage.nbytes())
        return t

    def batch_arrived(self) -> None:
        if self.done:
            return
        self._pop()  # the previous batch reached no backward: it was no training step
        self.seen = {}
        try:
            hooks = self.torch.autograd.graph.saved_tensors_hooks(self._pack, _unchanged)
            hooks.__enter__()
        except Exception:  # hooks disabled (functorch, FSDP) or another torch: not measured
            self.done = True
            return
        self.hooks = hooks

    def backward(self) -> None:
        """The first training forward ended (its backward starts now): send what it saved."""
        if self.done or self.hooks is None:
            return
        self._pop()
        self.done = True
        self.bytes = sum(self.seen.values())
        self.seen = {}
        self.rec.fact("mem.activations_peak_bytes", self.bytes,
                      "watch: saved for backward: storages autograd saved in the first training "
                      "forward (saved-tensor hooks from its batch's arrival to its backward)")

    def _pop(self) -> None:
        hooks, self.hooks = self.hooks, None
        if hooks is not None:
            with contextlib.suppress(Exception):
                hooks.__exit__(None, None, None)


def _unchanged(t: Any) -> Any:
    return t


class _StepPeak:
    """The first training step's memory peak, measured, for the ledger's transient item.

    Host: ``/proc/self/clear_refs`` ``5`` resets VmHWM to the current RSS at each batch's arrival
    until the first optimizer step (a single syscall); VmHWM at the first optimizer step is the step's peak. CUDA: the allocator's peak
    is reset at the same moment (only when the program already uses CUDA).
    """

    def __init__(self, torch: ModuleType, rec: Recorder, saved: _SavedForBackward) -> None:
        self.torch, self.rec, self.saved = torch, rec, saved
        self.rss_before: int | None = None
        self.cuda_before: int | None = None
        self.done = False

    def batch_arrived(self) -> None:
        # Until the first optimizer step every batch may be the first training step's.
        self.saved.batch_arrived()
        if self.done:
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss_before = _status_bytes("VmRSS")
        except OSError:
            self.rss_before = None
        cuda = self.torch.cuda
        if cuda.is_initialized():
            cuda.reset_peak_memory_stats()
            self.cuda_before = int(cuda.memory_allocated())

    def first_optimizer_step(self, left_bytes: int) -> None:
        """``left_bytes``: gradients + optimizer state, which the step leaves allocated."""
        self.done = True
        self.saved.backward()  # no torch.autograd.backward seen (torch.autograd.grad): now
        hwm = _status_bytes("VmHWM") if self.rss_before is not None else None
        if hwm is not None and self.rss_before is not None:
            rise = max(hwm - self.rss_before, 0)
            self.rec.fact("mem.step_peak_rise_bytes", rise,
                          "watch: VmHWM during the first training step (reset through "
                          "/proc/self/clear_refs at its batch's arrival) − VmRSS then")
            if not self.torch.cuda.is_initialized():  # on a GPU the activations are not here
                saved = self.saved.bytes or 0
                self.rec.fact("mem.forward_transient_bytes", max(rise - left_bytes - saved, 0),
                              "watch: first training step's VmHWM rise − saved for backward − "
                              "gradients − optimizer state")
        if self.cuda_before is not None:
            peak = int(self.torch.cuda.max_memory_allocated()) - self.cuda_before
            self.rec.fact("mem.cuda_step_peak_bytes", peak,
                          "watch: allocator peak during the first training step above what was "
                          "allocated at its batch's arrival")


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _tensor_bytes(tensors: Iterable[Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def _ledger_facts(opt: Any, rec: Recorder) -> int:
    """Weights, gradients and optimizer state at the first optimizer step (state exists now)."""
    params: dict[int, Any] = {}
    buffers: dict[int, Any] = {}
    for module in list(rec.roots):
        params.update((id(p), p) for p in module.parameters())
        buffers.update((id(b), b) for b in module.buffers())
    params.update((id(p), p) for g in opt.param_groups for p in g["params"])
    weights = [*params.values(), *buffers.values()]
    params_list = list(params.values())
    trainable = [p for p in params_list if p.requires_grad]
    grads = [p.grad for p in trainable if p.grad is not None]
    state = [v for s in opt.state.values() if isinstance(s, dict) for v in s.values()
             if hasattr(v, "element_size")]
    source = ("parameters and buffers of the modules put in train/eval mode (or fit by "
              "Lightning's Trainer), plus the optimizer's parameters" if rec.roots else
              "the optimizer's parameters only (no module was put in train/eval mode)")
    rec.fact("mem.weights_bytes", _tensor_bytes(weights), f"watch: {source}")
    rec.fact("mem.gradients_bytes", _tensor_bytes(grads),
             "watch: .grad of trainable parameters at the first optimizer step")
    rec.fact("mem.optimizer_bytes", _tensor_bytes(state),
             "watch: optimizer state tensors after the first optimizer step")
    rec.fact("model.params", sum(int(p.numel()) for p in params_list), f"watch: {source}")
    rec.fact("model.trainable_params", sum(int(p.numel()) for p in trainable),
             f"watch: {source}, requires_grad")
    rec.channel.flush()
    return _tensor_bytes(grads) + _tensor_bytes(state)


def _hook_cuda_init(torch: ModuleType, rec: Recorder, nvml: Any = None) -> None:
    """Measure the CUDA context as it is created: NVML's memory for this process just before
    and just after ``torch.cuda._lazy_init`` (which creates the context and allocates nothing).
    Only where ``pynvml`` is importable in the watched interpreter; otherwise not measured."""
    orig = getattr(torch.cuda, "_lazy_init", None)
    if orig is None or torch.cuda.is_initialized():
        return

    def _lazy_init() -> Any:
        if torch.cuda.is_initialized() or not rec.owner():
            return orig()
        nv = nvml if nvml is not None else _try_pynvml()
        before = _nvml_process_bytes(nv)
        out = orig()
        after = _nvml_process_bytes(nv)
        if before is not None and after is not None and rec.once("cuda-context"):
            rec.fact("mem.cuda_context_bytes", max(after - before, 0),
                     "watch: NVML per-process used memory right after torch initialised CUDA "
                     "(before any allocation) − before")
        return out

    torch.cuda._lazy_init = _lazy_init


def _try_pynvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no NVML here: the context is simply not measured
        return None


def _nvml_process_bytes(nv: Any) -> int | None:
    """This process's device memory over every GPU, per NVML (None without NVML)."""
    if nv is None:
        return None
    pid, total = os.getpid(), 0
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle) or []:
                if p.pid == pid:
                    total += int(p.usedGpuMemory or 0)
    except Exception:
        return None
    return total


def _cuda_identity(torch: ModuleType, rec: Recorder) -> None:
    """UUID and PCI bus id of each visible device: cuda:N is NVML's gpuN only by luck
    (CUDA_VISIBLE_DEVICES, CUDA's fastest-first order); the analysis maps by these."""
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            rec.fact(f"torch.cuda{index}.uuid", str(uuid),
                     "watch: torch.cuda.get_device_properties().uuid")
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
            rec.fact(f"torch.cuda{index}.pci_bus_id", f"{domain:08x}:{bus:02x}:{device:02x}.0",
                     "watch: torch.cuda.get_device_properties() pci ids")


def _cuda_memory(torch: ModuleType, rec: Recorder) -> None:
    if not torch.cuda.is_initialized():
        return
    if rec.once("cuda-identity"):
        _cuda_identity(torch, rec)
    t = rec.unix(rec.clock())
    for index in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(index)
        for key, metric in TORCH_STATS.items():
            if key in stats:
                rec.send(["M", t, f"torch:cuda{index}", metric, float(stats[key])])
