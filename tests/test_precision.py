"""Precision helpers: CPU bf16 detection from real cpuinfo text, autocast, channels_last."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from stepscope.train.precision import (
    autocast_context,
    bf16_pays,
    cpu_flags,
    cpu_has_bf16,
    to_channels_last,
)

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R45
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 avx512_vnni
bogomips\t: 5200.00

processor\t: 1
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16 avx512_vnni
"""
OLD_X86_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


ARM_CPUINFO = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes bf16 i8mm\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_bf16_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    assert cpu_has_bf16(write(tmp_path, X86_CPUINFO))
    assert not cpu_has_bf16(write(tmp_path, OLD_X86_CPUINFO))
    # arm64 lists "bf16" under Features; oneDNN's bf16 convolutions are x86 kernels, so no.
    assert "bf16" in cpu_flags(write(tmp_path, ARM_CPUINFO))
    assert not cpu_has_bf16(write(tmp_path, ARM_CPUINFO))
    assert not cpu_has_bf16(tmp_path / "absent")


def test_this_machine_agrees_with_proc_cpuinfo() -> None:
    text = Path("/proc/cpuinfo").read_text()
    assert cpu_has_bf16() == ("avx512_bf16" in text or "amx_bf16" in text)
    assert bf16_pays(torch.device("cpu")) == cpu_has_bf16()


def test_bf16_pays_follows_the_device(tmp_path: Path) -> None:
    assert bf16_pays(torch.device("cpu"), write(tmp_path, X86_CPUINFO))
    assert not bf16_pays(torch.device("cpu"), write(tmp_path, OLD_X86_CPUINFO))
    assert not bf16_pays(torch.device("meta"))
    if not torch.cuda.is_available():
        assert not bf16_pays(torch.device("cuda"))


def test_autocast_context_switches_matmul_dtype() -> None:
    a = torch.randn(4, 4)
    with autocast_context(torch.device("cpu"), True):
        assert (a @ a).dtype == torch.bfloat16
    with autocast_context(torch.device("cpu"), False):
        assert (a @ a).dtype == torch.float32


def test_channels_last_propagates_through_convolutions() -> None:
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1))
    head = nn.Linear(4, 2)
    assert to_channels_last(net) is net
    to_channels_last(head)
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert head.weight.is_contiguous()
    out = net(torch.randn(2, 3, 16, 16))  # a plain NCHW batch: the weight decides the layout
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(not cpu_has_bf16(), reason="CPU has no native bf16 units")
def test_bf16_convolution_stays_close_to_fp32() -> None:
    conv = to_channels_last(nn.Conv2d(16, 16, 3, padding=1))
    x = torch.randn(2, 16, 32, 32).contiguous(memory_format=torch.channels_last)
    expected = conv(x)
    with autocast_context(torch.device("cpu"), True):
        got = conv(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.05)
