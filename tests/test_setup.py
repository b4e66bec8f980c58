"""Trainer set-up decisions: --workers auto and the device."""

from __future__ import annotations

import pytest
import torch

from stepscope.errors import StepscopeError
from stepscope.train.setup import resolve_device, resolve_workers

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


def test_workers_auto_on_cpu_loads_cheap_pipelines_inline() -> None:
    assert resolve_workers("auto", cores=2, device=CPU, backend="fused") == 0
    assert resolve_workers("auto", cores=2, device=CPU, backend="none") == 0
    # The faithful SciPy augmentation costs about as much as the trunk: one worker.
    assert resolve_workers("auto", cores=2, device=CPU, backend="keras") == 1
    assert resolve_workers("auto", cores=1, device=CPU, backend="keras") == 1


def test_workers_auto_on_gpu_uses_all_cores_but_one() -> None:
    assert resolve_workers("auto", cores=16, device=CUDA, backend="fused") == 8
    assert resolve_workers("auto", cores=4, device=CUDA, backend="fused") == 3
    assert resolve_workers("auto", cores=1, device=CUDA, backend="fused") == 1


def test_explicit_workers_win() -> None:
    assert resolve_workers("3", cores=2, device=CPU, backend="fused") == 3


def test_cuda_without_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(StepscopeError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"
