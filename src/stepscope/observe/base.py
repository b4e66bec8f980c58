"""What every sampler is: the protocol, where its samples go, and how it says it cannot work.

A leaf module: the samplers (``host``, ``proctree``, ``disk``, ``gpu``, ``pagecache``) import it,
and ``sampling`` imports them, so nothing imports in a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from stepscope.store.records import ProcessInfo, Sample

NoteFn = Callable[[str, str], None]


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns 'now' into samples. ``now`` is the sampling thread's clock reading;
    rates are computed against differences of ``now`` so tests can inject a clock."""

    name: str

    def sample(self, now: float) -> list[Sample]: ...


class SampleSink(Protocol):
    """Where SamplerThread writes: a ``RunWriter``, or anything with these three methods."""

    def add_samples(self, samples: Iterable[Sample]) -> None: ...

    def put_process(self, proc: ProcessInfo) -> None: ...

    def note(self, source: str, text: str) -> None: ...


class SamplerUnavailable(Exception):
    """Raised by a sampler's constructor when it cannot work on this machine; the message is
    the reason, written as the run's note."""


__all__ = ["NoteFn", "SampleSink", "Sampler", "SamplerUnavailable"]
