"""When the probe's timings may be trusted: pure Python over per-round figures.

The modes are timed in rounds, round-robin (runner.py): each round every timed mode
runs a few steps, one mode after the other, so that a neighbour's burst or the CPU's
clock lands on all of them alike. A mode's speed-up is the median over rounds of the
round's ratio (fp32's step time over the mode's, both the fastest of their round's
steps: contention only ever slows a step down), with a distribution-free confidence
interval of that median from the order statistics. The rounds go on until every
speed-up is *settled* (its interval lies on one side of each verdict threshold) or
*precise* (the interval is narrow), and stop after a bounded number of rounds; a
figure whose interval is still wide then is unreliable, and is never printed as a
plain number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Below this a speed-up is within what two identical fp32 runs differ by here; its
# inverse is the other side of "as fast as fp32". The rounds' verdict thresholds.
MIN_SPEEDUP = 1.10
SPEED_THRESHOLDS = (1 / MIN_SPEEDUP, MIN_SPEEDUP)
# The interval's confidence: 1 - 2 * the binomial tail kept out on each side.
CONFIDENCE_TAIL = 0.05
# The rounds stop early when the interval is this narrow (hi / lo), whatever the thresholds.
PRECISE = 1.10
# After the last round, an interval wider than this (hi / lo) that is not settled
# makes the figure unreliable.
RELIABLE = 1.30


def _binom_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values`: the j-th smallest and
    j-th largest, with j the largest such that P(Binomial(n, 1/2) < j) <= the tail.
    None when there are too few values for any such interval (fewer than 5)."""
    xs = sorted(v for v in values if math.isfinite(v))
    n = len(xs)
    j = 0
    while j + 1 <= n // 2 and _binom_cdf(j, n) <= CONFIDENCE_TAIL:
        j += 1
    if j == 0:
        return None
    return xs[j - 1], xs[n - j]


@dataclass
class Figure:
    """A ratio measured over rounds: its median, interval, and whether it can be trusted."""

    value: float | None
    low: float | None
    high: float | None
    rounds: int
    settled: bool  # the interval lies wholly on one side of every threshold
    precise: bool  # the interval is narrow (hi / lo <= PRECISE)
    reliable: bool

    @property
    def width(self) -> float | None:
        if self.low is None or self.high is None or self.low <= 0:
            return None
        return self.high / self.low

    def to_dict(self) -> dict[str, object]:
        return {"value": self.value, "low": self.low, "high": self.high, "rounds": self.rounds,
                "settled": self.settled, "reliable": self.reliable}


def figure(ratios: list[float], thresholds: tuple[float, ...] = ()) -> Figure:
    """The median of per-round ratios, its interval, and the verdicts on it."""
    xs = [r for r in ratios if math.isfinite(r) and r > 0]
    if not xs:
        return Figure(None, None, None, 0, False, False, False)
    value = statistics.median(xs)
    ci = median_interval(xs)
    if ci is None:
        return Figure(value, min(xs), max(xs), len(xs), False, False, False)
    lo, hi = ci
    settled = all(not (lo < t <= hi) for t in thresholds) if thresholds else False
    precise = hi / lo <= PRECISE
    reliable = precise or settled or hi / lo <= RELIABLE
    return Figure(value, lo, hi, len(xs), settled, precise, reliable)


def steady(figures: list[Figure]) -> bool:
    """Every figure settled or precise: more rounds would not change what is said."""
    return all(f.settled or f.precise for f in figures)


def round_ratios(base: list[float], mode: list[float]) -> list[float]:
    """Per round: fp32's time over the mode's (a speed-up), for rounds both finished."""
    return [b / m for b, m in zip(base, mode) if b > 0 and m > 0]


def round_spread(times: list[float]) -> float | None:
    """The interval of the median step time as a share of it (hi - lo) / median."""
    ci = median_interval(times)
    med = statistics.median(times) if times else 0
    if ci is None or med <= 0:
        return None
    return (ci[1] - ci[0]) / med
