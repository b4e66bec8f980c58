"""Docstring examples are run, so they cannot drift from the code.

``RUNNABLE`` modules have self-contained examples: doctest runs every one. The others' examples
need something a unit test does not have (a recorded run such as ``runs/demo``, made by
``stepscope demo``; a GPU; a child process); they are listed in ``NEEDS_A_RUN`` with why. A new
module with examples must be put in one of the two lists, so nothing is left unrun by accident.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


SRC = Path(__file__).resolve().parents[1] / "src"

RUNNABLE = [
    "stepscope.analysis.contracts",
    "stepscope.analysis.doctor",
    "stepscope.analysis.fmt",
    "stepscope.analysis.gpu_identity",
    "stepscope.analysis.spans",
    "stepscope.analysis.tune",
    "stepscope.analysis.verdicts",
    "stepscope.atomic",
    "stepscope.errors",
    "stepscope.metrics",
    "stepscope.observe.callbacks",
    "stepscope.observe.proctree",
    "stepscope.observe.steps",
    "stepscope.policy",
    "stepscope.render.tune",
    "stepscope.store.export",
    "stepscope.store.rundir",
    "stepscope.store.stepfold",
    "stepscope.train.augment",
    "stepscope.train.models",
    "stepscope.train.precision",
    "stepscope.train.tune",
    "stepscope.train.tune_plan",
]
NEEDS_A_RUN = {
    "stepscope.analysis.compare": "two recorded runs' summaries",
    "stepscope.analysis.evidence": "a recorded run",
    "stepscope.analysis.explain": "runs/demo",
    "stepscope.analysis.ranks": "per-rank stores of a distributed run",
    "stepscope.analysis.samples": "a recorded run",
    "stepscope.analysis.summary": "runs/demo",
    "stepscope.analysis.timeline": "runs/demo",
    "stepscope.finish": "a recorded run",
    "stepscope.hf": "Hugging Face Trainer",
    "stepscope.keras": "Keras (not in a torch process)",
    "stepscope.lightning": "Lightning Trainer",
    "stepscope.notebook": "a notebook and a recorded run",
    "stepscope.observe.blkio": "root and a cgroup-v1 blkio hierarchy",
    "stepscope.observe.disk": "a live writer and block devices",
    "stepscope.observe.gpu": "an NVIDIA GPU (NVML)",
    "stepscope.observe.host": "this machine's /proc and cgroups",
    "stepscope.observe.machine": "this machine's disks and CPU (figures vary)",
    "stepscope.observe.monitor": "a training loop",
    "stepscope.observe.pagecache": "dataset files",
    "stepscope.observe.phase_hint": "a process under `stepscope watch`",
    "stepscope.observe.sampling": "a live run writer",
    "stepscope.observe.watch": "a training script to run",
    "stepscope.render.html": "a recorded run",
    "stepscope.render.html_compare": "two recorded runs",
    "stepscope.render.tensorboard": "a recorded run",
    "stepscope.render.terminal": "runs/demo",
    "stepscope.render.trace": "a recorded run",
    "stepscope.store.db": "runs/demo",
    "stepscope.tblive": "a run being written",
    "stepscope.train.ceilings": "model builds and forward passes (slow)",
    "stepscope.train.data": "a dataset on disk",
    "stepscope.train.distributed": "torchrun and a process group",
    "stepscope.train.featcache": "a training run",
    "stepscope.train.loop": "a training run",
    "stepscope.train.predict": "runs/demo's checkpoint",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _has_examples_to_run(path: Path) -> bool:
    """True when a docstring has an example not marked ``+SKIP``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return any(line.lstrip().startswith(">>>") and "doctest: +SKIP" not in line for line in lines)


@pytest.mark.parametrize("name", RUNNABLE)
def test_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS,
                             report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_every_module_with_examples_is_run_or_says_why_not() -> None:
    with_examples = {_name(p) for p in (SRC / "stepscope").rglob("*.py")
                     if "inject" not in p.parts and _has_examples_to_run(p)}
    unclassified = with_examples - set(RUNNABLE) - set(NEEDS_A_RUN)
    assert unclassified == set(), "add them to RUNNABLE (self-contained) or NEEDS_A_RUN (why)"
