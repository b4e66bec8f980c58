"""`stepscope --version` and shell completion (Typer's --install-completion / --show-completion)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


SRC = str(Path(__file__).parents[1] / "src")


def _stepscope(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": SRC, **env})


def test_version() -> None:
    proc = _stepscope("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"stepscope {stepscope.__version__}"


def test_completion_script_and_completions() -> None:
    # --show-completion detects the shell from the parent processes: run it under bash (the
    # trailing `; true` keeps bash from exec-ing python in its place).
    cmd = shlex.join([sys.executable, "-m", "stepscope", "--show-completion"])
    script = subprocess.run(["bash", "-c", f"{cmd}; true"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": SRC})
    assert script.stderr == ""
    assert "complete" in script.stdout and "_STEPSCOPE_COMPLETE" in script.stdout
    # What bash asks for when the user types `stepscope rep<TAB>` / `stepscope report --tr<TAB>`.
    words = _stepscope(_STEPSCOPE_COMPLETE="complete_bash", COMP_WORDS="stepscope rep",
                       COMP_CWORD="1")
    assert words.stdout.split() == ["report"]
    flags = _stepscope(_STEPSCOPE_COMPLETE="complete_bash", COMP_WORDS="stepscope report --t",
                       COMP_CWORD="2")
    assert set(flags.stdout.split()) == {"--trace", "--tensorboard"}
