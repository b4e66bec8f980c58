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
- at the optimizer step, the memory ledger (``stepscope_watch_torch_memory``): weights,
  gradients, optimizer state and the step's peak, at the first step and again where an epoch
  trains other parameters.
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
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from stepscope.observe.inject import stepscope_watch_torch_memory as memory
else:  # sitecustomize imports this file from its folder, not as part of stepscope
    import stepscope_watch_torch_memory as memory

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
    ledger = memory.TorchLedger(torch, rec)
    _patch_loader(torch, rec, loop, count_images, loop_module.IterState, ledger.peak)
    _patch_module_mode(torch, rec)
    _patch_transfers(torch, rec, loop)
    _hook_body(torch, rec, loop, ledger)
    rec.periodic.append(lambda: _cuda_memory(torch, rec))
    _hook_cuda_init(torch, rec)
    # checkpoints, written between steps and phases
    setattr(torch, "save", rec.timed_save(torch.save))  # noqa: B010 (mypy: ModuleType)
    return loop


def runtime_baseline(rec: Recorder, module: str, above: str = "") -> None:
    """The ledger's framework baseline: RSS once ``module`` finished importing. A framework
    imported on top of torch (Lightning: ~280 MB more RSS) sends it again, naming what it
    ``above``; the store keeps the last one, which covers both."""
    baseline = memory.status_bytes("VmRSS")
    if baseline is not None:
        rec.runtime_baseline(baseline, f"watch: the process's RSS when `import {module}` "
                             f"finished (interpreter, {above}{module} and what the script "
                             "imported before it)")


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
                  peak: memory.StepPeak) -> None:
    dl = torch.utils.data.dataloader
    orig_iter = dl.DataLoader.__iter__
    orig_next = dl._BaseDataLoaderIter.__next__
    outer = {"depth": 0}  # > 0 inside a subclass iterator's __next__: it is the one timed
    forward = _ForwardSignal(torch, rec, loop)

    def framework_batch(batch: Any) -> None:
        # A framework loop's training batch (Lightning's batch-start hook): its batches bypass
        # the timed DataLoader and it enters autocast inside its step, so the step's memory
        # measurement starts here and the precision is read at its first layer with weights.
        peak.batch_arrived()
        if forward.precision.pending:
            forward.precision.start((_first_tensor(torch, batch),))

    rec.train_batch_arrived = framework_batch

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
        self.torch, self.rec, self.loop = torch, rec, loop
        self.handle: Any = None
        self.precision = _PrecisionProbe(torch, rec, self.register)

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
        # a plain loop's (Keras on torch records its own policy, under framework_depth)
        if self.precision.pending and self.torch.is_grad_enabled() \
                and self.rec.framework_depth == 0:
            self.precision.start(args)


def _first_tensor(torch: ModuleType, batch: Any) -> Any:
    """A batch's first tensor: itself, or the first in a tuple, list or dict (the inputs, as
    datasets put them before their labels)."""
    items = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else (batch,)
    return next((x for x in items if isinstance(x, torch.Tensor)), None)


class _PrecisionProbe:
    """How the first training forward ran, so the compute advice leaves out what the script
    already does: its input's layout (channels_last or not), and the precision its first layer
    with weights of its own ran in: under autocast (its dtype) or in the weights' dtype. Read at
    that layer, not at the model's call: Accelerate's ``mixed_precision`` enters autocast inside
    the model's wrapped ``forward``, after the call's pre-hooks. A global pre-hook from the first
    training forward until that layer (at most ``MAX_CALLS`` module calls), then never again."""

    MAX_CALLS = 1000

    def __init__(self, torch: ModuleType, rec: Recorder, register: Any) -> None:
        self.torch, self.rec, self.register = torch, rec, register
        self.pending = True
        self.handle: Any = None
        self.calls = 0

    def start(self, args: Any) -> None:
        self.pending = False
        torch, x = self.torch, args[0] if args else None
        with contextlib.suppress(Exception):  # another torch, an unusual input: not read
            if isinstance(x, torch.Tensor) and x.dim() == 4:
                self.rec.fact("train.channels_last",
                              bool(x.is_contiguous(memory_format=torch.channels_last)
                                   and not x.is_contiguous()),
                              "watch: the first training forward's input tensor is channels_last")
            self.handle = self.register(self._layer)

    def _layer(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self.rec.main_thread_id:
            return
        self.calls += 1
        param = next(module.parameters(recurse=False), None)
        if param is None and self.calls < self.MAX_CALLS:
            return
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()
        if param is None:
            return
        torch = self.torch
        device = param.device.type
        with contextlib.suppress(Exception):
            if torch.is_autocast_enabled(device):
                dtype, how = torch.get_autocast_dtype(device), f"torch.autocast({device!r}) on"
            else:
                dtype, how = param.dtype, "its weights' dtype"
            self.rec.fact("train.precision",
                          {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32"),
                          f"watch: the first training forward's first layer with weights "
                          f"({type(module).__name__}): {how} ({dtype})")


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


def _hook_body(torch: ModuleType, rec: Recorder, loop: LoopTracker,
               ledger: memory.TorchLedger) -> None:
    peak = ledger.peak

    def post_step(opt: Any, args: Any, kwargs: Any) -> None:
        if not rec.owner():
            return
        if _watching(rec):
            t = rec.clock()
            rec.optimizer_stepped(t)
            loop.body("optimizer", t)
        # The ledger is the model's wherever its loop lives: inside Lightning's (framework_depth
        # > 0) the same torch.optim step is the first moment the optimizer state exists.
        ledger.optimizer_stepped(opt)

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
