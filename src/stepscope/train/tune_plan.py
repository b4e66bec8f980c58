"""``stepscope tune``'s budget planner: how the time budget is shared between the three kinds of
measurement, and how many steps a real run gets. Pure arithmetic on an injectable clock, so it
is tested with a fake one.

Examples:
    >>> t = iter([0.0, 30.0, 30.0]).__next__
    >>> b = Budget(120.0, t)
    >>> b.left(), b.fraction()
    (90.0, 0.25)
"""

from __future__ import annotations

from collections.abc import Callable

from stepscope.observe.monitor import DEFAULT_WARMUP_STEPS

Clock = Callable[[], float]

# Shares of the budget for the two cheap stages; real runs get what is left. The real runs
# matter most (they alone include the contention between loader and trunk), so they get half.
COMPUTE_SHARE = 0.2
LOADER_SHARE = 0.25
MAX_REAL_RUNS = 5
MIN_STEADY_STEPS = 3  # steady-state steps a real run needs after the recorder's warm-up steps
MAX_RUN_STEPS = 60  # enough steady steps for a stable rate; more only spends budget
# Measured rates are optimistic about a real run (no contention), and runs have start-up costs
# we only learn after the first: plan runs as if they took this much longer than estimated.
RUN_SAFETY = 1.5
RESERVE_S = 1.0  # kept back for writing the result


class Budget:
    """Wall-clock budget with an injectable clock."""

    def __init__(self, budget_s: float, clock: Clock) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def fraction(self) -> float:
        return min(1.0, max(0.0, self.elapsed() / self.budget_s)) if self.budget_s > 0 else 1.0

    def stage_left(self, share: float) -> float:
        """Seconds left before the stages up to cumulative ``share`` of the budget are over."""
        return self.budget_s * share - self.elapsed()


def min_run_steps() -> int:
    """The shortest real run that measures anything: warm-up plus ``MIN_STEADY_STEPS``."""
    return DEFAULT_WARMUP_STEPS + MIN_STEADY_STEPS


def run_need_s(overhead_s: float, batch: int, rate: float) -> float:
    """Seconds the shortest real run needs at ``rate`` images/s, with the safety margin."""
    return RUN_SAFETY * (overhead_s + min_run_steps() * batch / rate)


def plan_steps(per_run_s: float, overhead_s: float, rate: float, batch: int, epoch_steps: int
               ) -> int:
    """Steps that fit in ``per_run_s`` at ``rate``, at least warm-up + MIN_STEADY_STEPS.

    Examples:
        >>> plan_steps(30.0, 2.0, 80.0, 8, epoch_steps=100)
        60
        >>> plan_steps(3.0, 2.0, 80.0, 8, epoch_steps=100)
        6
    """
    fit = int((per_run_s / RUN_SAFETY - overhead_s) * rate / batch)
    low = min_run_steps()
    return max(low, min(fit, MAX_RUN_STEPS, max(epoch_steps, low)))


__all__ = ["COMPUTE_SHARE", "LOADER_SHARE", "MAX_REAL_RUNS", "RESERVE_S", "Budget",
           "plan_steps", "run_need_s"]
