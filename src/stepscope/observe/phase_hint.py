"""``stepscope.phase_hint``: tell ``stepscope watch`` which phase a block of a script is, for
loops whose shape its rules cannot read (an optimizer torch's hooks cannot see, a validation
loop that steps an optimizer). Outside ``watch`` it does nothing.

Examples:
    >>> import stepscope
    >>> with stepscope.phase_hint("val"):
    ...     for batch in loader:
    ...         evaluate_with_test_time_adaptation(batch)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from stepscope.errors import StepscopeError

PHASES = ("train", "val")
# The module name watch's sitecustomize imports it under, in the watched interpreter.
LOOP_MODULE = "stepscope_watch_loop"


@contextmanager
def phase_hint(phase: str) -> Iterator[None]:
    """Batches that arrive inside the block are ``phase`` steps, whatever the loop does."""
    if phase not in PHASES:
        raise StepscopeError(f"unknown phase {phase!r}; expected 'train' or 'val'")
    tracker = getattr(sys.modules.get(LOOP_MODULE), "ACTIVE", None)
    if tracker is None:  # not under stepscope watch
        yield
        return
    previous, tracker.forced = tracker.forced, phase
    try:
        yield
    finally:
        tracker.forced = previous
