"""The command line: every command has --help with an example; user errors are one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepscope.cli import app
from stepscope.store.db import RunWriter
from stepscope.store.records import RunInfo
from tests.conftest import data_flags

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


COMMANDS = ["demo", "data synth", "train", "predict", "report", "explain", "compare", "top",
            "doctor", "watch", "tune", "export"]
runner = CliRunner()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example(command: str) -> None:
    result = runner.invoke(app, [*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=300)


def _one_line(text: str) -> str:
    """What the CLI printed, as one line: the console wraps it at 80 columns, and where a phrase
    breaks depends on the length of the temporary path before it (a CI run broke "already holds
    a recorded run" at pytest-1030)."""
    return " ".join(text.split())


def test_missing_column_is_one_line_without_traceback(synth80: Path, tmp_path: Path) -> None:
    f = data_flags(synth80)
    r = _cli("train", "--csv", f["csv"], "--images", f["images"], "--x-col", "File",
             "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "File" in r.stderr and "Photo" in r.stderr  # what was asked and what exists
    assert len(r.stderr.strip().splitlines()) <= 3


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    r = _cli("--debug", "explain", str(tmp_path))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_not_a_run_directory(tmp_path: Path) -> None:
    r = _cli("explain", str(tmp_path))
    assert r.returncode == 2 and "no run database" in _one_line(r.stderr)


def test_watch_refuses_a_folder_that_holds_a_run(tmp_path: Path) -> None:
    RunWriter(tmp_path, RunInfo(name="first", command="python train.py", kind="watch")).close()
    r = _cli("watch", "--out", str(tmp_path), "--", sys.executable, "-c", "print('ran')")
    assert r.returncode == 2 and "already holds a recorded run" in _one_line(r.stderr), r.stderr
    assert "ran" not in r.stdout and "Traceback" not in r.stderr


def test_unknown_model_lists_close_matches(synth80: Path, tmp_path: Path) -> None:
    f = data_flags(synth80)
    r = _cli("train", "--csv", f["csv"], "--val-csv", f["val_csv"], "--images", f["images"],
             "--model", "efficientnet_lite", "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "efficientnet_lite0" in r.stderr and "Traceback" not in r.stderr


def test_cuda_memory_flags_on_cpu_are_a_note(synth80: Path, tmp_path: Path) -> None:
    f = data_flags(synth80)
    r = _cli("train", "--csv", f["csv"], "--val-csv", f["val_csv"], "--images", f["images"],
             "--weights", "none", "--img-size", "64", "--epochs", "1", "--max-steps", "1",
             "--gpu-memory-fraction", "0.5", "--alloc-conf", "expandable_segments:True",
             "--device", "cpu", "--no-monitor", "--out", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    assert "apply to CUDA only" in _one_line(r.stdout)


def test_predict_prints_class_and_probability(synth80: Path, tmp_path: Path) -> None:
    f = data_flags(synth80)
    run = tmp_path / "r"
    r = _cli("train", "--csv", f["csv"], "--val-csv", f["val_csv"], "--images", f["images"],
             "--img-size", "96", "--epochs", "1", "--max-steps", "2", "--out", str(run))
    assert r.returncode == 0, r.stderr
    assert (run / "summary.json").is_file() and (run / "report.html").is_file()
    img = sorted((synth80 / "images").glob("cat.*.jpg"))[0]
    p = _cli("predict", str(run / "checkpoints" / "last.pt"), str(img))
    assert p.returncode == 0, p.stderr
    name, label, prob = p.stdout.strip().split("\t")
    assert name == str(img) and label in ("cat", "dog") and 0.5 <= float(prob) <= 1.0
