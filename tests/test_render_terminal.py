"""Terminal renderables, checked against exact output on a 100-column console without colour."""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass
from typing import Any

import pytest
from rich.console import Console, RenderableType

from stepscope.analysis.compare import compare_summaries
from stepscope.analysis.contracts import ledger_item, make_finding
from stepscope.analysis.fmt import fmt_bytes
from stepscope.render.terminal import comparison_table, explanation, phase_table

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


SUMMARY: dict[str, Any] = {
    "run": {"name": "seed", "status": "completed"},
    "phases": [
        {"epoch": 1, "phase": "train", "steps": 100, "images": 800, "seconds": 100.0,
         "images_per_s": 8.0, "data_wait_frac": 0.62, "transfer_frac": 0.01,
         "compute_frac": 0.35, "verdict": "input-bound", "input_cause": "storage",
         "disk_read_bytes": 450e6, "cache_read_bytes": 20e6,
         "dataset_resident_frac_start": 0.0, "dataset_resident_frac_end": 0.82,
         "cpu_util_pct": 61.0, "gpu_util_pct": None},
        {"epoch": 1, "phase": "val", "steps": 25, "images": 200, "seconds": 10.0,
         "images_per_s": 20.0, "data_wait_frac": 0.1, "transfer_frac": 0.01,
         "compute_frac": 0.87, "verdict": "compute-bound", "input_cause": None,
         "disk_read_bytes": 100e6, "cache_read_bytes": 0,
         "dataset_resident_frac_start": 0.82, "dataset_resident_frac_end": 1.0,
         "cpu_util_pct": 98.0, "gpu_util_pct": 71.0},
    ],
    "memory": {"device": "cuda:0", "total_bytes": 6.5e9, "ledger": [
        ledger_item("CUDA context", 4.0e8, "NVML used − reserved"),
        ledger_item("weights", 2.2e8, "parameters + buffers")],
        "unattributed_bytes": 5.88e9},
    "findings": [
        make_finding("input_bound_train", "high", "Epoch 1 waits for the disk",
                     ["62 % of step time blocked in the loader", "450 MB read from disk"],
                     "warm the page cache or use faster storage", "~2.5× faster")],
}


def render(renderable: RenderableType) -> list[str]:
    """Render like rich's own tests: fixed width, no colour, no terminal; trailing blanks cut
    (an editor would strip them from the expected text)."""
    console = Console(width=100, file=io.StringIO(), color_system=None, legacy_windows=False,
                      force_terminal=False, _environ={})
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return [line.rstrip() for line in out.splitlines()]


def test_phase_table() -> None:
    assert render(phase_table(SUMMARY)) == [
        "Epochs and phases (steady-state steps)",
        "",
        " epoch    img/s  wait  copy  comp  verdict                  disk  cache  resident   CPU   GPU",
        " " + "─" * 92,
        " 1 train    8.0  62 %   1 %  35 %  input-bound (storage)  450 MB  20 MB    0→82 %  61 %     —",
        " 1 val     20.0  10 %   1 %  87 %  compute-bound          100 MB    0 B  82→100 %  98 %  71 %",
        "",
        "wait = blocked on the data loader, copy = host→device, comp = forward + backward + optimizer",
        "(shares of step time); disk = bytes read from the device; cache = bytes served by the page",
        "cache; resident = share of the dataset in the page cache at start→end; CPU = mean over cores;",
        "GPU = NVML utilization",
    ]


def test_phase_table_fits_80_columns_and_leaves_out_what_no_phase_measured() -> None:
    """A CPU run: no copy column (nothing goes to a device), no GPU column (none measured), and
    no line of the table or its legend wider than an 80-column terminal, none cropped."""
    cpu = copy.deepcopy(SUMMARY)
    cpu["run"]["device"] = "cpu"
    for p in cpu["phases"]:
        p["gpu_util_pct"] = None
    console = Console(width=80, file=io.StringIO(), color_system=None, legacy_windows=False,
                      force_terminal=False, _environ={})
    console.print(phase_table(cpu))
    lines = [line.rstrip() for line in console.file.getvalue().splitlines()]  # type: ignore[attr-defined]
    head = lines[2].split()
    assert "copy" not in head and "GPU" not in head and head[-1] == "CPU", head
    assert all(len(line) <= 80 for line in lines)
    legend = " ".join(lines[lines.index("", 3) + 1:])
    assert legend.endswith("CPU = mean over cores") and "copy =" not in legend
    assert "served by the page cache" in legend  # folded whole, not cropped


def test_comparison_table() -> None:
    b = copy.deepcopy(SUMMARY)
    b["run"]["name"] = "warm"
    b["phases"][0].update(images_per_s=20.0, seconds=40.0, data_wait_frac=0.05,
                          verdict="compute-bound", input_cause=None)
    lines = render(comparison_table(compare_summaries(SUMMARY, b)))
    assert lines[:7] == [
        "training: 8.0 → 20.0 img/s (2.5×)   validation: 20.0 → 20.0 img/s (1.00×)",
        "warm vs seed",
        "",
        " epoch   phase   a img/s   b img/s     b÷a    wait a→b   verdict a → b",
        " " + "─" * 93,
        "     1   train       8.0      20.0    2.5×    62 %→5 %   input-bound (storage) → compute-bound",
        "     1   val        20.0      20.0   1.00×   10 %→10 %   compute-bound",
    ]
    assert " total          6.5 GB   6.5 GB     0 B" in lines


@dataclass
class Answer:
    title: str
    text: str


def test_explanation() -> None:
    answers = [Answer("Why is the disk idle after epoch 1?", "The page cache holds the files.")]
    assert render(explanation(answers)) == [
        "Why is the disk idle after epoch 1?", "The page cache holds the files."]


def test_fmt_bytes() -> None:
    assert [fmt_bytes(v) for v in (None, 0, 999, 1500, 6.5e9, 999.96e6, -2e6)] == [
        "—", "0 B", "999 B", "1.5 kB", "6.5 GB", "1.0 GB", "-2.0 MB"]
