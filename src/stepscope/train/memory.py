"""Measurements for the memory ledger, taken once by the trainer (see docs/records.md, facts).

What each figure includes:
- weights: every parameter and buffer of the model, as allocated.
- gradients: ``.grad`` of the trainable parameters after the first backward.
- optimizer: the optimizer's state tensors after its first step (Adam keeps two per parameter).
- saved for backward: tensors autograd saved for backward during the first training forward,
  counted once per storage (a frozen trunk under ``no_grad`` saves none; only the head's input
  remains). This is not the forward's peak: the trunk's activations live only while the next
  layer computes, and are freed before backward.
- forward transient peak: the first training step's peak above what was resident when its
  batch arrived (VmHWM, reset through ``/proc/self/clear_refs`` at that moment), minus what the
  step leaves allocated (saved for backward, gradients, optimizer state): the largest
  activations and workspaces alive at once. CUDA: the allocator's peak over the same step.
- input batch: the uint8 batch as it reaches the model plus its float32 normalised copy.
- runtime baseline: this process's resident memory after importing the framework, before the
  model exists (libraries, thread pools, interpreter).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from stepscope.observe.base import SamplerUnavailable
from stepscope.observe.gpu import Nvml, measure_cuda_context, torch_device_identity
from stepscope.observe.monitor import Monitor

_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_rss_bytes() -> int:
    """Resident set size of this process now (``/proc/self/statm``)."""
    fields = Path("/proc/self/statm").read_text().split()
    return int(fields[1]) * _PAGE


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class MemoryProbe:
    """Records the ledger's facts: static ones at start, the rest around the first step."""

    def __init__(
        self, mon: Monitor, model: torch.nn.Module, device: torch.device, *, name: str
    ) -> None:
        self.mon, self.model, self.device, self.name = mon, model, device, name
        self._step_done = False
        self._after_done = False
        self._rss_before: int | None = None
        self._saved_bytes = 0

    def record_static(self, files: Sequence[Path], baseline_bytes: int, *, workers: int) -> None:
        mon, model = self.mon, self.model
        sizes = [_size(f) for f in files]
        mon.fact("dataset.files", len(files), "files listed for train + val")
        mon.fact("dataset.bytes", sum(sizes), "sum of the listed files' sizes (os.stat)")
        mon.fact("model.name", self.name, "timm model name")
        params = list(model.parameters())
        mon.fact("model.params", sum(p.numel() for p in params), "parameters")
        mon.fact("model.trainable_params", sum(p.numel() for p in params if p.requires_grad),
                 "parameters with requires_grad")
        weights = tensor_bytes(params) + tensor_bytes(model.buffers())
        mon.fact("mem.weights_bytes", weights, "parameters + buffers, numel x element size")
        mon.fact("model.state_dict_bytes", weights, "what a checkpoint of the weights holds")
        mon.fact("mem.runtime_baseline_bytes", baseline_bytes,
                 "process RSS after importing torch, before building the model")
        mon.fact("loader.workers", workers, "DataLoader num_workers")
        mon.fact("mem.framework", "torch", "")
        mon.fact("env.device", str(self.device), "")
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else 0
            for key, (value, how) in torch_device_identity(torch, index).items():
                mon.fact(key, value, how)

    def record_cuda_context(self, context_bytes: int | None) -> None:
        if context_bytes is not None:
            self.mon.fact("mem.cuda_context_bytes", context_bytes,
                          "NVML per-process used memory right after CUDA initialised (an empty "
                          "tensor, no allocation) − before")

    def record_precision(self, *, bf16: bool, bf16_supported: bool, channels_last: bool) -> None:
        self.mon.fact("train.precision", "bf16" if bf16 else "fp32", "autocast dtype of the trunk")
        self.mon.fact("train.channels_last", channels_last, "memory format of trunk and input")
        self.mon.fact("env.bf16", bf16_supported, "CPU flags avx512_bf16/amx_bf16, or a bf16 GPU")

    @contextlib.contextmanager
    def first_step(self, x: torch.Tensor, training: bool) -> Iterator[None]:
        """Around the first training forward: count what autograd saves for backward."""
        if self._step_done or not training:
            yield
            return
        self._step_done = True
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
            return t

        self.mon.fact("mem.input_batch_bytes", x.numel() * x.element_size() + x.numel() * 4,
                      "uint8 batch + its float32 normalised copy")
        peak_before = _cuda_peak_reset(self.device)
        self._rss_before = reset_peak_rss()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self._saved_bytes = sum(seen.values())
        self.mon.fact("mem.activations_peak_bytes", self._saved_bytes,
                      "saved for backward: storages autograd saved in the first training forward "
                      "(saved-tensor hooks)")
        if peak_before is not None:
            peak = torch.cuda.max_memory_allocated(self.device) - peak_before
            self.mon.fact("mem.cuda_step_peak_bytes", peak,
                          "allocator peak during the first step above what was allocated before")

    def after_first_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After the first optimizer step: gradients and optimizer state exist now."""
        if self._after_done:
            return
        self._after_done = True
        grads = tensor_bytes(p.grad for p in self.model.parameters() if p.grad is not None)
        self.mon.fact("mem.gradients_bytes", grads, ".grad of trainable parameters")
        state = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        state_bytes = tensor_bytes(state)
        self.mon.fact("mem.optimizer_bytes", state_bytes,
                      f"{type(optimizer).__name__} state tensors after its first step")
        hwm = status_bytes("VmHWM")
        if self.device.type == "cpu" and hwm is not None and self._rss_before is not None:
            rise = max(hwm - self._rss_before, 0)
            self.mon.fact("mem.step_peak_rise_bytes", rise,
                          "VmHWM during the first training step − VmRSS at its batch's arrival "
                          "(peak reset through /proc/self/clear_refs)")
            self.mon.fact("mem.forward_transient_bytes",
                          max(rise - self._saved_bytes - grads - state_bytes, 0),
                          "first training step's VmHWM rise − saved for backward − gradients − "
                          "optimizer state (VmHWM reset through /proc/self/clear_refs)")
        if self.device.type == "cuda":
            stats = torch.cuda.host_memory_stats()
            self.mon.fact("mem.pinned_bytes", stats.get("reserved_bytes.current", 0),
                          "torch.cuda.host_memory_stats reserved (pinned host memory)")


def cuda_context_bytes(device: torch.device) -> int | None:
    """The CUDA context's size, measured by NVML around CUDA's initialisation (None on a CPU,
    without NVML, or when CUDA is already initialised and the moment has passed)."""
    if device.type != "cuda" or torch.cuda.is_initialized():
        return None
    try:
        nvml = Nvml(lambda source, text: None)
    except SamplerUnavailable:
        return None
    try:
        # An empty tensor creates the context and allocates nothing.
        return measure_cuda_context(lambda: torch.empty(0, device=device), torch.cuda.memory_reserved,
                                    nvml, os.getpid())
    finally:
        nvml.shutdown()


def reset_peak_rss() -> int | None:
    """Reset this process's VmHWM to its current RSS; return that RSS (None where unsupported).

    Writing ``5`` to ``/proc/self/clear_refs`` resets the peak resident set size (Linux ≥ 4.0),
    so VmHWM read later is the peak *since now*, not since the process started.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return status_bytes("VmRSS")


def status_bytes(key: str) -> int | None:
    """A ``kB`` figure of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _cuda_peak_reset(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.memory_allocated(device))
