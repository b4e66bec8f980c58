"""stepscope: make a training run explain itself.

The public API for instrumenting your own loop is :class:`Monitor`; see README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Monitor", "__version__", "phase_hint", "show"]

if TYPE_CHECKING:
    from stepscope.notebook import show
    from stepscope.observe.monitor import Monitor
    from stepscope.observe.phase_hint import phase_hint


def __getattr__(name: str) -> Any:
    # Lazy so that `import stepscope` (e.g. from the CLI or watch's sitecustomize) stays cheap
    # and does not pull in torch before the user's script does.
    if name == "Monitor":
        from stepscope.observe.monitor import Monitor

        return Monitor
    if name == "phase_hint":
        from stepscope.observe.phase_hint import phase_hint

        return phase_hint
    if name == "show":
        from stepscope.notebook import show

        return show
    raise AttributeError(name)
