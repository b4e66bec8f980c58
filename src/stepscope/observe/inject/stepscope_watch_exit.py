"""The uncaught exception that ends the watched process: named in the run (``run.exception``)
and printed as Python would, less the frames of watch's hooks that only passed the call on.

A hook that wraps a user's call (Keras's ``fit``, a DataLoader's ``__next__``, a Lightning
hook) sits between the user's frames in every traceback that passes through it. A user reading
``stepscope_watch_keras.py, in wrapper`` takes stepscope for the cause; the frames carry nothing
of theirs, so they are left out, and a last line says how many. A traceback whose innermost
frame is watch's own (an error in a hook) is printed whole: that one is ours to answer for.

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypedDict

HERE = os.path.dirname(os.path.abspath(__file__))
HOW = ("watch: the uncaught exception that ended the watched process (sys.excepthook): its "
       "type, its message's first line, and the innermost frame outside watch's hooks")
MESSAGE_CHARS = 200


class Raised(TypedDict):
    """The ``run.exception`` fact (``analysis.contracts_summary.RunException`` reads it)."""

    type: str
    message: str
    file: str | None
    line: int | None


def install(fact: Callable[[str, Any, str], None]) -> None:
    """Chain ``sys.excepthook``: record the exception with ``fact``, then print its traceback.
    A hook set before ours (another ``sitecustomize``) prints as it would have; a script that
    sets its own later replaces ours, and nothing is recorded."""
    prior = sys.excepthook

    def excepthook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            if not issubclass(etype, KeyboardInterrupt):  # the run's status says it already
                fact("run.exception", describe(etype, value, tb), HOW)
        except Exception:  # the traceback must be printed whatever recording does
            pass
        if prior is not sys.__excepthook__ or sys.stderr is None:
            prior(etype, value, tb)
            return
        try:
            shown = traceback.TracebackException(etype, value, tb)
            hidden = strip_frames(shown, HERE)
            text = "".join(shown.format())
        except Exception:
            prior(etype, value, tb)
            return
        if hidden:
            text += (f"(stepscope watch: {hidden} frame{'s' if hidden != 1 else ''} of its "
                     "hooks, which only passed the call on, left out of this traceback)\n")
        sys.stderr.write(text)
        sys.stderr.flush()

    sys.excepthook = excepthook


def describe(etype: type[BaseException], value: BaseException, tb: Any) -> Raised:
    """``{"type", "message", "file", "line"}``: the message's first line (at most
    ``MESSAGE_CHARS``), and where it was raised, outside watch's hooks (None when nowhere)."""
    module = getattr(etype, "__module__", "builtins")
    name = etype.__qualname__ if module == "builtins" else f"{module}.{etype.__qualname__}"
    lines = str(value).strip().splitlines()
    message = lines[0][:MESSAGE_CHARS] if lines else ""
    where = [f for f in traceback.extract_tb(tb) if not _ours(f.filename, HERE)]
    last = where[-1] if where else None
    return {"type": name, "message": message,
            "file": None if last is None else last.filename,
            "line": None if last is None else last.lineno}


def strip_frames(shown: traceback.TracebackException, here: str) -> int:
    """Drop from ``shown`` (and the exceptions chained to it) the frames of files under
    ``here`` that have a frame of someone else's inside them; return how many went."""
    hidden, seen, todo = 0, set(), [shown]
    while todo:
        te = todo.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        stack = te.stack
        if stack and not _ours(stack[-1].filename, here):
            kept = [f for f in stack if not _ours(f.filename, here)]
            hidden += len(stack) - len(kept)
            stack[:] = kept
        todo += [t for t in (te.__cause__, te.__context__) if t is not None]
        todo += getattr(te, "exceptions", None) or []
    return hidden


def _ours(filename: str, here: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)) == here
