"""The memory ledger of a watched PyTorch process: what its model items weigh and what a
training step adds at its peak.

Read at the first optimizer step (inside Lightning's loop too): weights, gradients and optimizer
state; the step's peak (host VmHWM reset through ``/proc/self/clear_refs`` at its batch's
arrival; on CUDA the allocator's peak over the same span); what autograd saved for backward in
its forward (:class:`SavedForBackward`). A loop that unfreezes its trunk later (torchvision's
fine-tuning tutorial: the head alone, then the whole network with a new optimizer) only then
allocates the trunk's gradients, its optimizer state and the activations its backward needs, so
at the first optimizer step of each epoch the trainable parameters are counted again; where the
count changed, the ledger is read again and the next training step measured again, and the
largest reading of each item is kept (:class:`TorchLedger`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder


class SavedForBackward:
    """Bytes autograd saved for backward in a training forward, as ``stepscope train`` counts
    them (``train/memory.py``): a pack hook (``saved_tensors_hooks``) notes each saved tensor's
    storage once by its address; unpack hands the tensor back unchanged. The hooks are pushed at
    a batch's arrival and popped at its backward; a batch that reaches no backward (validation,
    a probe) is discarded and the next one measured. After the measured backward no hook is
    pushed again (until :meth:`again`), so the steps after it run exactly as without watch.
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
        """The measured training forward ended (its backward starts now): send what it saved,
        where it is more than an earlier measurement."""
        if self.done or self.hooks is None:
            return
        self._pop()
        self.done = True
        found = sum(self.seen.values())
        self.seen = {}
        if self.bytes is not None and found <= self.bytes:
            return
        self.bytes = found
        self.rec.fact("mem.activations_peak_bytes", found,
                      "watch: saved for backward: storages autograd saved in the first training "
                      "forward (saved-tensor hooks from its batch's arrival to its backward; "
                      "measured again after the trainable parameters changed, the larger kept)")

    def again(self) -> None:
        """Measure the next training forward too."""
        self.done = False

    def _pop(self) -> None:
        hooks, self.hooks = self.hooks, None
        if hooks is not None:
            with contextlib.suppress(Exception):
                hooks.__exit__(None, None, None)


def _unchanged(t: Any) -> Any:
    return t


class StepPeak:
    """A training step's memory peak, measured, for the ledger's transient item.

    Host: ``/proc/self/clear_refs`` ``5`` resets VmHWM to the current RSS at each batch's arrival
    until the measured optimizer step (a single syscall); VmHWM then is the step's peak. CUDA:
    the allocator's peak is reset at the same moment (only when the program already uses CUDA).
    """

    def __init__(self, torch: ModuleType, rec: Recorder, saved: SavedForBackward) -> None:
        self.torch, self.rec, self.saved = torch, rec, saved
        self.rss_before: int | None = None
        self.cuda_before: int | None = None
        self.done = False
        self.best: dict[str, int] = {}  # the largest reading of each fact sent
        self.first_rss: int | None = None  # at the first batch's arrival: the loop begins

    def batch_arrived(self) -> None:
        # Until the measured optimizer step every batch may be the measured training step's.
        self.saved.batch_arrived()
        if self.done:
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss_before = status_bytes("VmRSS")
            if self.first_rss is None:
                self.first_rss = self.rss_before
        except OSError:
            self.rss_before = None
        cuda = self.torch.cuda
        if cuda.is_initialized():
            cuda.reset_peak_memory_stats()
            self.cuda_before = int(cuda.memory_allocated())

    def again(self) -> None:
        """Measure the next training step too (its forward's saved tensors as well)."""
        self.done = False
        self.rss_before = self.cuda_before = None  # read again at the next batch's arrival
        self.saved.again()

    def optimizer_step(self, new_bytes: int) -> None:
        """The measured step's optimizer step ran. ``new_bytes``: what the step allocated and
        left allocated (gradients, and optimizer state where this step created it)."""
        self.done = True
        self.saved.backward()  # no torch.autograd.backward seen (torch.autograd.grad): now
        hwm = status_bytes("VmHWM") if self.rss_before is not None else None
        if hwm is not None and self.rss_before is not None:
            rise = max(hwm - self.rss_before, 0)
            self._send("mem.step_peak_rise_bytes", rise,
                       "watch: VmHWM during the first training step (reset through "
                       "/proc/self/clear_refs at its batch's arrival) − VmRSS then")
            if not self.torch.cuda.is_initialized():  # on a GPU the activations are not here
                saved = self.saved.bytes or 0
                self._send("mem.forward_transient_bytes", max(rise - new_bytes - saved, 0),
                           "watch: first training step's VmHWM rise − saved for backward − "
                           "gradients − optimizer state")
        if self.cuda_before is not None:
            peak = int(self.torch.cuda.max_memory_allocated()) - self.cuda_before
            self._send("mem.cuda_step_peak_bytes", peak,
                       "watch: allocator peak during the first training step above what was "
                       "allocated at its batch's arrival")

    def _send(self, key: str, value: int, how: str) -> None:
        if key in self.best and value <= self.best[key]:
            return
        again = key in self.best
        self.best[key] = value
        self.rec.fact(key, value, how + ("; measured again after the trainable parameters "
                                         "changed, the larger kept" if again else ""))


class TorchLedger:
    """The ledger's model items at the first optimizer step, and again at the first optimizer
    step of an epoch whose trainable parameters differ from the last count (once an epoch: a
    membership test a step otherwise)."""

    def __init__(self, torch: ModuleType, rec: Recorder) -> None:
        self.rec = rec
        self.peak = StepPeak(torch, rec, SavedForBackward(torch, rec))
        self.epoch: int | None = None  # the recorder's epoch at the last count
        self.trainable: int | None = None
        self.left = 0  # gradients + optimizer state of the largest reading
        self.by_epoch: list[list[int]] = []
        self.again = False  # the next training step is measured again
        self.off = False  # another ledger (a Keras loop's) was read: this one stays out

    def optimizer_stepped(self, opt: Any) -> None:
        rec, peak = self.rec, self.peak
        if self.again:
            self.again = False
            peak.optimizer_step(_grad_bytes(opt, rec))
        if self.epoch == rec.epoch or self.off:
            return
        first = self.epoch is None
        if first and not rec.once("ledger"):
            self.off = True
            return
        # A plain loop's step is given its phase (and a new epoch its number) as it closes,
        # after this hook: the first step of an epoch still reads the one before; its second
        # step counts. Lightning's callbacks have opened the epoch by its first step.
        self.epoch = rec.epoch
        if not first and not rec.roots:
            # No module was put in train/eval mode: the parameters known are this optimizer's
            # alone, and a second optimizer (a GAN's) would read as a change.
            return
        params, buffers = _model_tensors(opt, rec)
        trainable = sum(int(p.numel()) for p in params if p.requires_grad)
        if trainable == self.trainable:
            return
        grads, state = _grads(params), _state(opt)
        left = tensor_bytes(grads) + tensor_bytes(state)
        if first:
            _send_items(rec, params, buffers, grads, state, "the first optimizer step")
            _before_loop(rec, peak.first_rss, tensor_bytes([*params, *buffers]))
            self.by_epoch = [[max(rec.epoch, 1), trainable]]
            peak.optimizer_step(left)
        else:
            self.by_epoch.append([rec.epoch, trainable])
            rec.fact("model.trainable_by_fit", self.by_epoch,
                     "watch: PyTorch parameters with requires_grad at the first optimizer step "
                     "and at each epoch's first optimizer steps where their count changed")
            if left > self.left:
                _send_items(rec, params, buffers, grads, state,
                             f"epoch {rec.epoch}'s optimizer step, where the trainable "
                             "parameters changed (the largest reading)")
            peak.again()
            self.again = True
        self.trainable, self.left = trainable, max(left, self.left)
        rec.channel.flush()


def _before_loop(rec: Recorder, first_rss: int | None, weights: int) -> None:
    """What the script built between the framework's import and its loop's first batch: the
    imports after it, in-memory data, the model's objects beyond its weights."""
    base = rec.rss_marks.get("import")
    if first_rss is not None and base is not None:
        rec.fact("mem.before_loop_bytes", max(0, first_rss - base - weights),
                 "watch: RSS growth from the framework's import to the loop's first batch, "
                 "minus the weights (later imports, the script's in-memory data, model "
                 "building)")


def _model_tensors(opt: Any, rec: Recorder) -> tuple[list[Any], list[Any]]:
    params: dict[int, Any] = {}
    buffers: dict[int, Any] = {}
    for module in list(rec.roots):
        params.update((id(p), p) for p in module.parameters())
        buffers.update((id(b), b) for b in module.buffers())
    params.update((id(p), p) for g in opt.param_groups for p in g["params"])
    return list(params.values()), list(buffers.values())


def _grads(params: list[Any]) -> list[Any]:
    return [p.grad for p in params if p.requires_grad and p.grad is not None]


def _state(opt: Any) -> list[Any]:
    return [v for s in opt.state.values() if isinstance(s, dict) for v in s.values()
            if hasattr(v, "element_size")]


def _grad_bytes(opt: Any, rec: Recorder) -> int:
    """Gradients the measured step allocated (the optimizer's state existed before it)."""
    return tensor_bytes(_grads(_model_tensors(opt, rec)[0]))


def _send_items(rec: Recorder, params: list[Any], buffers: list[Any], grads: list[Any],
                state: list[Any], when: str) -> None:
    source = ("parameters and buffers of the modules put in train/eval mode (or fit by "
              "Lightning's Trainer), plus the optimizer's parameters" if rec.roots else
              "the optimizer's parameters only (no module was put in train/eval mode)")
    rec.fact("mem.weights_bytes", tensor_bytes([*params, *buffers]), f"watch: {source}")
    rec.fact("mem.gradients_bytes", tensor_bytes(grads),
             f"watch: .grad of trainable parameters at {when}")
    rec.fact("mem.optimizer_bytes", tensor_bytes(state),
             f"watch: optimizer state tensors after {when}")
    if when == "the first optimizer step":
        rec.fact("model.params", sum(int(p.numel()) for p in params), f"watch: {source}")
        rec.fact("model.trainable_params",
                 sum(int(p.numel()) for p in params if p.requires_grad),
                 f"watch: {source}, requires_grad at the first optimizer step")


def status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def tensor_bytes(tensors: Iterable[Any]) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)
