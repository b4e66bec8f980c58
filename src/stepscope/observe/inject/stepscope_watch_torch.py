"""PyTorch hooks for ``stepscope watch``, installed right after ``import torch`` finishes.

- ``DataLoader.__iter__``: a new iterator is a new phase. It is ``val`` when, at that moment,
  grad is disabled (``torch.no_grad()``/``inference_mode``) or the last outermost
  ``nn.Module.train(mode)`` call (``model.eval()`` is ``train(False)``) set eval mode; otherwise
  ``train``. Starting the iterator counts as the first step's data wait.
- ``_BaseDataLoaderIter.__next__``: the time blocked in it is the step's data wait; a call closes
  the previous step; ``StopIteration`` closes the phase.
- ``Tensor.to``/``Tensor.cuda`` to a non-CPU device during a step: transfer time.
- a global optimizer step post-hook: where a training step's compute ends; at the first one, the
  memory-ledger facts (weights, gradients, optimizer state).
- CUDA allocator figures once a second at a step boundary, only once the program itself has
  initialised CUDA (reading them never synchronises and never creates a context).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder

TORCH_STATS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "allocated_bytes.all.peak": "max_allocated_bytes",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
}


def install(torch: ModuleType, rec: Recorder, count_images: Callable[[Any], int]) -> None:
    """Patch ``torch`` in place so that ``rec`` sees its loops."""
    _patch_loader(torch, rec, count_images)
    _patch_module_mode(torch, rec)
    _patch_transfers(torch, rec)
    _hook_optimizer(torch, rec)
    rec.periodic.append(lambda: _cuda_memory(torch, rec))


def _phase_now(torch: ModuleType, rec: Recorder) -> str:
    grad_off = not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
    return "val" if grad_off or rec.last_mode_eval else "train"


def _patch_loader(torch: ModuleType, rec: Recorder, count_images: Callable[[Any], int]) -> None:
    dl = torch.utils.data.dataloader
    orig_iter = dl.DataLoader.__iter__
    orig_next = dl._BaseDataLoaderIter.__next__

    def __iter__(self: Any) -> Any:
        # Inside Keras/Lightning loops their callbacks time the steps; a forked worker never
        # reports.
        if rec.framework_depth > 0 or not rec.owner():
            return orig_iter(self)
        t0 = rec.clock()
        with contextlib.suppress(Exception):  # discovery is a nicety
            rec.dataset_files(self.dataset)
        ph = rec.begin_phase(_phase_now(torch, rec), getattr(self, "num_workers", None), t0)
        it = orig_iter(self)
        try:
            it._stepscope_phase = ph
            it._stepscope_t0 = t0
        except AttributeError:
            pass
        return it

    def __next__(self: Any) -> Any:
        ph = self.__dict__.get("_stepscope_phase")
        if ph is None or ph.ended:
            return orig_next(self)
        t0 = rec.clock()
        rec.end_step(t0)
        start = self.__dict__.pop("_stepscope_t0", t0)
        try:
            batch = orig_next(self)
        except StopIteration:
            rec.end_phase(ph, rec.clock())
            raise
        rec.begin_step(ph, start, rec.clock(), count_images(batch))
        return batch

    dl.DataLoader.__iter__ = __iter__
    dl._BaseDataLoaderIter.__next__ = __next__


def _patch_module_mode(torch: ModuleType, rec: Recorder) -> None:
    orig_train = torch.nn.Module.train

    def train(self: Any, mode: bool = True) -> Any:
        # Only the outermost call counts: Module.train recurses into every child.
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


def _patch_transfers(torch: ModuleType, rec: Recorder) -> None:
    tensor = torch.Tensor
    main_id = rec.main_thread_id

    def timed(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Outside a step, or off the main thread (pin-memory thread), it is not the loop's.
            if rec.step is None or threading.get_ident() != main_id:
                return orig(self, *args, **kwargs)
            t0 = rec.clock()
            out = orig(self, *args, **kwargs)
            dt = rec.clock() - t0
            device = getattr(out, "device", None)
            if out is not self and device is not None and device.type != "cpu" \
                    and device != self.device:
                rec.add_transfer(dt)
                if rec.once("device"):
                    rec.send(["R", str(device)])
            return out

        wrapper.__name__ = getattr(orig, "__name__", "to")
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        return wrapper

    tensor.to = timed(tensor.to)
    tensor.cuda = timed(tensor.cuda)


def _hook_optimizer(torch: ModuleType, rec: Recorder) -> None:
    def post_step(opt: Any, args: Any, kwargs: Any) -> None:
        if rec.framework_depth > 0 or not rec.owner():
            return
        rec.optimizer_stepped(rec.clock())
        if rec.once("ledger"):
            _ledger_facts(opt, rec)

    # torch.optim.optimizer is loaded by `import torch` but not bound as an attribute.
    importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(post_step)


def _tensor_bytes(tensors: Iterable[Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


def _ledger_facts(opt: Any, rec: Recorder) -> None:
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
    source = ("parameters and buffers of the modules put in train/eval mode, plus the "
              "optimizer's parameters" if rec.roots else "the optimizer's parameters only "
              "(no module was put in train/eval mode)")
    rec.fact("mem.weights_bytes", _tensor_bytes(weights), f"watch: {source}")
    rec.fact("mem.gradients_bytes", _tensor_bytes(grads),
             "watch: .grad of trainable parameters at the first optimizer step")
    rec.fact("mem.optimizer_bytes", _tensor_bytes(state),
             "watch: optimizer state tensors after the first optimizer step")
    rec.fact("model.params", sum(int(p.numel()) for p in params_list), f"watch: {source}")
    rec.fact("model.trainable_params", sum(int(p.numel()) for p in trainable),
             f"watch: {source}, requires_grad")
    rec.channel.flush()


def _cuda_memory(torch: ModuleType, rec: Recorder) -> None:
    if not torch.cuda.is_initialized():
        return
    t = rec.unix(rec.clock())
    for index in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats(index)
        for key, metric in TORCH_STATS.items():
            if key in stats:
                rec.send(["M", t, f"torch:cuda{index}", metric, float(stats[key])])
