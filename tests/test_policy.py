"""The shared rules: one definition each, fed plain numbers."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope import policy
from stepscope.policy import (
    auto_workers,
    bf16_pays,
    job_cores,
    more_workers,
    predict_images_per_s,
    steady_steps,
    use_bf16,
    weighted_mean,
)

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_policy_imports_nothing_from_the_layers() -> None:
    """It sits below every layer: anything may import it, it imports no stepscope module."""
    tree = ast.parse(Path(policy.__file__).read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith("stepscope") or n in ("torch", "numpy")]


def test_job_cores_is_affinity_capped_by_the_quota() -> None:
    assert job_cores(16, None) == 16
    assert job_cores(16, 2.5) == 2  # 2.5 cores of quota: two threads to schedule
    assert job_cores(2, 8.0) == 2
    assert job_cores(4, 0.5) == 1


@given(st.floats(min_value=0, max_value=1e4, allow_nan=False), st.integers(1, 512),
       st.booleans())
def test_workers_never_exceed_the_cores(need: float, cores: int, on_gpu: bool) -> None:
    assert 0 <= auto_workers(need, cores, on_gpu=on_gpu) <= max(1, cores - 1)
    assert auto_workers(None, cores, on_gpu=on_gpu) <= max(1, cores - 1)


@given(st.integers(0, 64), st.integers(1, 128))
def test_more_workers_proposes_an_increase_within_the_cores(current: int, cores: int) -> None:
    t = more_workers(current, cores)
    assert t is None or current < t <= cores


def test_inline_loading_below_a_quarter_of_a_core() -> None:
    assert auto_workers(0.25, 2, on_gpu=False) == 0
    assert auto_workers(0.26, 2, on_gpu=False) == 1
    assert auto_workers(0.1, 2, on_gpu=True) == 1  # a GPU always gets a loader process
    assert auto_workers(None, 16, on_gpu=True) == policy.GPU_MAX_WORKERS
    assert more_workers(0, 2) == 2 and more_workers(1, 2) == 2 and more_workers(2, 2) is None
    assert more_workers(2, 8) == 4 and more_workers(5, 8) == 8 and more_workers(0, 1) == 1


def test_prediction_adds_times_without_workers_and_overlaps_with_them() -> None:
    serial = predict_images_per_s(loader_w=100, loader_0=100, compute=100, workers=0, cores=2,
                                  shared_cores=True)
    assert serial == pytest.approx(50.0)
    gpu = predict_images_per_s(loader_w=300, loader_0=100, compute=1000, workers=4, cores=8,
                               shared_cores=False)
    assert gpu == 300.0  # the loader limits a fast GPU
    cpu = predict_images_per_s(loader_w=1000, loader_0=500, compute=100, workers=2, cores=2,
                               shared_cores=True)
    # The trunk's 100 img/s, less the core time decoding takes from it: 1/(1/100 + 1/1000).
    assert cpu == pytest.approx(1 / (1 / 100 + 1 / 1000))
    # doctor's form: the trunk measured on 1 thread of 2 cores costs 1/F core-seconds an image.
    doc = predict_images_per_s(loader_w=float("inf"), loader_0=100, compute=50, workers=1,
                               cores=2, shared_cores=True, compute_core_s=1 / 50)
    assert doc == pytest.approx(min(50, 2 / (1 / 50 + 1 / 100)))


def test_bf16_pays_only_with_native_units() -> None:
    assert bf16_pays("cpu", cpu_flags={"avx2", "avx512_bf16"})
    assert bf16_pays("cpu", cpu_flags={"amx_bf16"})
    assert not bf16_pays("cpu", cpu_flags={"avx2", "avx512f"})
    assert bf16_pays("cuda", cuda_native_bf16=True) and not bf16_pays("cuda")
    assert not bf16_pays("mps", cpu_flags={"amx_bf16"})
    assert use_bf16("bf16", False) and use_bf16("auto", True)
    assert not use_bf16("auto", False) and not use_bf16("fp32", True)


@dataclass
class _Step:
    warmup: bool


def test_steady_steps_leave_warm_up_out_unless_that_is_all() -> None:
    kept, steady = steady_steps([_Step(True), _Step(False), _Step(False)])
    assert len(kept) == 2 and steady
    kept, steady = steady_steps([_Step(True)])
    assert len(kept) == 1 and not steady
    assert steady_steps([]) == ([], False)


def test_weighted_mean_over_the_rows_that_have_the_figure() -> None:
    rows = [{"x": 1.0, "seconds": 3.0}, {"x": 5.0, "seconds": 1.0}, {"x": None, "seconds": 9.0}]
    assert weighted_mean(rows, "x") == 2.0
    assert weighted_mean([{"x": 1.0, "seconds": 0.0}, {"x": 3.0, "seconds": 0.0}], "x") == 2.0
    assert weighted_mean([{"seconds": 1.0}], "x") is None
