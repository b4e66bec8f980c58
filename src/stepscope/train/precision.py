"""Numeric precision and memory layout: when bf16 autocast and channels_last pay off.

bf16 halves the bytes every convolution moves and, on hardware with bf16 dot-product units,
doubles or triples the arithmetic rate. Without such units PyTorch emulates bf16 through fp32
and it is *slower*, so "use bf16" is a question about the machine, answered here from its flags.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from stepscope import policy

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def cpu_flags(cpuinfo_path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags of the first CPU listed in ``cpuinfo_path`` (empty if unreadable).

    Examples:
        >>> "sse2" in cpu_flags()  # doctest: +SKIP
        True
    """
    try:
        text = cpuinfo_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    return _parse_flags(text.splitlines())


def _parse_flags(lines: Iterable[str]) -> frozenset[str]:
    # x86 kernels call the line "flags", arm64 kernels "Features"; every core repeats it,
    # and the cores of one machine agree, so the first line is enough.
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_bf16(cpuinfo_path: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU has native bf16 arithmetic (``avx512_bf16`` or ``amx_bf16``).

    Examples:
        >>> cpu_has_bf16()  # doctest: +SKIP
        True
    """
    return policy.cpu_has_native_bf16(cpu_flags(cpuinfo_path))


def bf16_pays(device: torch.device, cpuinfo_path: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether bf16 autocast is expected to speed up training on ``device``
    (:func:`stepscope.policy.bf16_pays`, fed this machine's facts).

    PyTorch's plain ``is_bf16_supported()`` would count a GPU that only emulates bf16.

    Examples:
        >>> bf16_pays(torch.device("cpu"))  # doctest: +SKIP
        True
    """
    if device.type == "cuda":
        native = torch.cuda.is_available() and bool(
            torch.cuda.is_bf16_supported(including_emulation=False))
        return policy.bf16_pays("cuda", cuda_native_bf16=native)
    if device.type == "cpu":
        return policy.bf16_pays("cpu", cpu_flags=cpu_flags(cpuinfo_path))
    return False


def autocast_context(
    device: torch.device, enabled: bool
) -> contextlib.AbstractContextManager[object]:
    """``torch.autocast(..., dtype=bfloat16)`` on ``device`` when ``enabled``, else a no-op.

    Examples:
        >>> with autocast_context(torch.device("cpu"), True):
        ...     y = torch.ones(2, 2) @ torch.ones(2, 2)
        >>> y.dtype
        torch.bfloat16
    """
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def to_channels_last(model: ModuleT) -> ModuleT:
    """Store the 4-D weights of ``model`` as NHWC (channels_last), in place; returns ``model``.

    oneDNN and cuDNN run convolutions natively in NHWC; in the default NCHW layout every
    convolution pays a reorder of its input and output, which at batch 8 costs as much as the
    arithmetic of a depthwise layer. A convolution whose weight is channels_last makes its
    output channels_last too, so the layout propagates through the network from the first conv.
    Linear heads (2-D weights) are untouched.

    Examples:
        >>> conv = to_channels_last(nn.Conv2d(3, 8, 3))
        >>> conv.weight.is_contiguous(memory_format=torch.channels_last)
        True
    """
    return model.to(memory_format=torch.channels_last)
