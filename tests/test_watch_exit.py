"""The uncaught exception under watch: recorded, and its traceback without watch's pass-through
frames (``observe/inject/stepscope_watch_exit.py``). The real path (a script raising under
``stepscope watch``) is ``test_watch.py::test_a_script_that_fails_mid_epoch_is_told_as_such``."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from stepscope.observe.inject import stepscope_watch_exit as exit_hook

pytestmark = pytest.mark.light


def _compiled(path: Path, source: str, name: str) -> Any:
    """A function whose frames carry ``path`` as their file, as a module there would."""
    path.write_text(source)
    space: dict[str, Any] = {}
    exec(compile(source, str(path), "exec"), space)
    return space[name]


def _raise_through(tmp_path: Path, inner: Any) -> BaseException:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    wrapper = _compiled(hooks / "stepscope_watch_x.py",
                        "def wrapper(f):\n    return f()\n", "wrapper")
    try:
        wrapper(inner)
    except BaseException as exc:  # the test's own raise
        return exc
    raise AssertionError("nothing raised")


def test_the_hooks_pass_through_frames_are_left_out_and_counted(tmp_path: Path) -> None:
    user = _compiled(tmp_path / "train.py",
                     "def step():\n    raise ValueError('bad batch\\nsecond line')\n", "step")
    exc = _raise_through(tmp_path, user)
    shown = traceback.TracebackException.from_exception(exc)
    assert any(f.filename.endswith("stepscope_watch_x.py") for f in shown.stack)
    assert exit_hook.strip_frames(shown, str(tmp_path / "hooks")) == 1
    text = "".join(shown.format())
    assert "stepscope_watch_x.py" not in text and "train.py" in text
    assert text.rstrip().endswith("ValueError: bad batch\nsecond line")


def test_an_error_in_a_hook_itself_is_shown_whole(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    broken = _compiled(hooks / "stepscope_watch_y.py",
                       "def hook():\n    return 1 / 0\n", "hook")
    try:
        broken()
    except ZeroDivisionError as exc:
        shown = traceback.TracebackException.from_exception(exc)
    assert exit_hook.strip_frames(shown, str(hooks)) == 0
    assert "stepscope_watch_y.py" in "".join(shown.format())


def test_the_exception_is_described_where_the_user_raised_it(tmp_path: Path) -> None:
    user = _compiled(tmp_path / "train.py", "def step():\n    raise KeyError('x' * 500)\n",
                     "step")
    exc = _raise_through(tmp_path, user)
    exit_hook.HERE, saved = str(tmp_path / "hooks"), exit_hook.HERE
    try:
        found = exit_hook.describe(type(exc), exc, exc.__traceback__)
    finally:
        exit_hook.HERE = saved
    assert found["type"] == "KeyError" and found["line"] == 2
    assert found["file"] == str(tmp_path / "train.py")
    assert len(found["message"]) == exit_hook.MESSAGE_CHARS
