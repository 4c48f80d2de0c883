"""Small statistics for the benchmark figures: per-step differences and bootstrap intervals."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence


def per_step(small_total: float, large_total: float, small_steps: int, large_steps: int) -> float:
    """What one more step costs: the difference between two runs that differ only in their number
    of steps, over that number (whatever both runs share, start-up and the rest, cancels)."""
    if large_steps <= small_steps:
        raise ValueError(f"the larger run must have more steps ({large_steps} <= {small_steps})")
    return (large_total - small_total) / (large_steps - small_steps)


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    *,
    level: float = 0.95,
    resamples: int = 4000,
    seed: int = 1,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic`` over ``values``.

    Resamples ``values`` with replacement ``resamples`` times (a fixed seed: the same values give
    the same interval) and returns the (1 - level) / 2 and (1 + level) / 2 quantiles of the
    statistic over the resamples."""
    if not values:
        raise ValueError("no values")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(statistic([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return quantile(stats, tail), quantile(stats, 1 - tail)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered``, interpolating linearly between neighbours."""
    if not ordered:
        raise ValueError("no values")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and extremes of ``values`` (what a figure's detail reports)."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p25": quantile(ordered, 0.25),
        "median": quantile(ordered, 0.5),
        "p75": quantile(ordered, 0.75),
        "max": ordered[-1],
    }


def p99(values: Sequence[float]) -> float:
    """The 99th percentile by nearest rank: the value at index int(0.99 n) of the sorted values
    (the largest of fewer than 100); 0 for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
