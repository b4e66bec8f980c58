"""The trainer's memory measurements that need no model: the VmHWM reset behind the ledger's
"forward transient peak"."""

from __future__ import annotations

import pytest

from stepscope.train.memory import reset_peak_rss, status_bytes


def test_vmhwm_reset_measures_a_transient_peak() -> None:
    before = reset_peak_rss()
    if before is None:
        pytest.skip("/proc/self/clear_refs is not writable here")
    block = bytearray(64 << 20)  # touched pages: a 64 MB transient
    block[::4096] = b"x" * len(block[::4096])
    del block
    hwm = status_bytes("VmHWM")
    assert hwm is not None and hwm - before >= 60 << 20
    # A second reset forgets the transient: the peak is measured from now on.
    again = reset_peak_rss()
    assert again is not None and status_bytes("VmHWM") - again < 32 << 20
