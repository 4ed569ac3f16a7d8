"""A saving with its uncertainty: an interval for the relative change b/a from paired rounds.

Each round of pairs.alternate_rounds times the run's way (a) and the changed way (b) back to back,
so a drift in the machine's speed hits both; the round's figure is d = log(b / a), and the interval
is for the median of d, turned back into a ratio b/a (0.8: the changed way takes 80% of the time).

The statistic: the sign-test interval for the median (the default, "sign"). The estimate is the
median of the d's, the interval two of their order statistics [d(k), d(n+1-k)], k the largest rank
whose exact binomial coverage 1 - 2·P(Bin(n, ½) ≤ k-1) is still at least the requested level; the
achieved coverage is reported (`level`). It assumes only independent rounds and a continuous
distribution: no normality, no symmetry. We chose it over the Hodges–Lehmann estimate with the
exact Wilcoxon signed-rank interval ("wilcoxon", kept for comparison) and over a paired t-interval
by simulating a noisy shared machine (docs/savings-intervals.md, benchmarks/paired_intervals.py
--simulate): all three cover at the level on clean noise, where Wilcoxon and t are narrower (0.08
against 0.13 at n = 6); but a slow-run spike on one variant more often than the other (a neighbour taking
a core while the slower way runs) makes the differences asymmetric, and then the Wilcoxon interval
(which assumes symmetry) covers 76–81% at n = 12–16 and the t-interval 65–79% (15% of B's runs
spiked), where the sign interval keeps 93% and 87%, and ≥ 90% in every milder case; and one spiked
round widens a Wilcoxon or t interval through every Walsh average (or the mean) it enters (n = 8,
10% spikes on both: 0.32 and 0.30 wide against 0.12), so from n = 8 on the sign interval finds a
real 10% saving more often whenever there are spikes. Its cost is granularity: at 90%, n = 5…7
rounds give the full range of the d's, n = 8 gives [d(2), d(7)] (93.0%), n = 11 [d(3), d(9)]
(93.5%), n = 13 [d(4), d(10)] (90.8%), n = 16 [d(5), d(12)] (92.3%); under 5 rounds no interval
reaches 90% (`enough` is False and no saving is claimed). Callers should time ADVISED_ROUNDS (8).

The words, each a stated rule:
- `within_noise`: the interval includes 1 (or too few rounds reached the level): no saving claimed.
- `seconds_saved`: a ratio interval on the seconds it applies to (a step, or the phase the change
  touches) -> seconds saved, seconds × (1 - ratio), with the interval's ends.
- `confidence`: "low" within noise; "high" when the interval's end nearest 1 is still at least half
  the estimate's effect (on the log scale: |log near| ≥ ½ |log estimate|), so a user gets at least
  half the promise at the stated level; "medium" otherwise.
- `tied`: two savings (in the same unit) whose intervals overlap are not ordered.
- `rounds_to_exclude_one` / `rounds_to_separate`: how many more rounds would likely decide, from the
  interval's half-width shrinking as 1/√n (a planning figure for the post-run budget, not a promise).

Pure: numpy only, no torch, no I/O.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

LEVEL = 0.90
STATISTICS = ("sign", "wilcoxon")
ADVISED_ROUNDS = 8  # the fewest rounds whose 90% sign interval is narrower than the d's full range
MAX_PLANNED_ROUNDS = 64  # rounds_to_*: beyond this, None (not worth the post-run budget)


@dataclass(frozen=True)
class Interval:
    """The relative change b/a: the estimate and its interval (ratios), the coverage the interval
    achieves (`level`, exact under the statistic's assumptions), the level asked for, rounds, and
    which statistic made it."""

    estimate: float
    low: float
    high: float
    level: float
    requested: float
    n: int
    statistic: str

    @property
    def enough(self) -> bool:
        """The rounds were enough to reach the requested level."""
        return self.level >= self.requested - 1e-12

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Interval":
        return cls(**{k: d[k] for k in ("estimate", "low", "high", "level", "requested", "n", "statistic")})


@dataclass(frozen=True)
class Saving:
    """Seconds saved on `of_s` seconds (a step, or the part a change touches): the estimate and its
    interval (low ≤ high; negative: the changed way is slower), with the ratio interval's level and
    rounds."""

    estimate: float
    low: float
    high: float
    of_s: float
    level: float
    n: int
    statistic: str
    within_noise: bool

    def as_dict(self) -> dict:
        return asdict(self)


# -- exact null distributions ----------------------------------------------------------------------

def signed_rank_counts(n: int) -> list[int]:
    """counts[t] = the number of the 2^n sign assignments of ranks 1..n whose positive ranks sum to
    t (the Wilcoxon signed-rank statistic's null distribution × 2^n): the coefficients of
    ∏_{j=1..n} (1 + x^j), one multiplication per rank. Exact integers."""
    counts = [1]
    for j in range(1, n + 1):
        new = counts + [0] * j
        for t, c in enumerate(counts):
            new[t + j] += c
        counts = new
    return counts


def sign_counts(n: int) -> list[int]:
    """counts[t] = the number of the 2^n sign assignments with t positive: C(n, t)."""
    return [math.comb(n, t) for t in range(n + 1)]


def critical_rank(counts: Sequence[int], level: float) -> tuple[int, float]:
    """(k, coverage): the largest k with 1 - 2·P(T ≤ k-1) ≥ level for the null counts of T (total
    2^n), and that coverage; (0, 1 - 2·P(T = 0)) when even the widest interval falls short, then the
    coverage of the widest (k = 1) interval."""
    total = sum(counts)
    cum, k = 0, 0
    for t, c in enumerate(counts[: (len(counts) + 1) // 2]):
        cum += c
        if 2 * cum <= (1 - level) * total * (1 + 1e-12):
            k = t + 1
        else:
            break
    below = sum(counts[:k]) if k else counts[0]
    return k, 1 - 2 * below / total


@functools.lru_cache(maxsize=256)
def _critical(statistic: str, n: int, level: float) -> tuple[int, float]:
    return critical_rank(sign_counts(n) if statistic == "sign" else signed_rank_counts(n), level)


# -- the interval ----------------------------------------------------------------------------------

def log_ratios(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """log(b_i / a_i) for each round; a and b positive seconds, one per round, same length."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired rounds need two equal, non-empty lists (got {a.shape} and {b.shape})")
    if not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("paired rounds need positive seconds")
    return np.log(b) - np.log(a)


def paired_ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL,
                          statistic: str = "sign") -> Interval:
    """The relative change b/a from rounds (a_i, b_i) timed back to back: a = the run's way, b = the
    changed way. "sign" (default): the median of log(b_i/a_i) and its exact sign-test interval;
    "wilcoxon": the Hodges–Lehmann estimate (median of the Walsh averages) and the exact Wilcoxon
    signed-rank interval. Under too few rounds for `level`, the widest interval and its (lower)
    coverage, `enough` False."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d = np.sort(log_ratios(a, b))
    n = d.size
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    k, achieved = _critical(statistic, n, level)
    if statistic == "sign":
        pts = d
    else:
        i, j = np.triu_indices(n)
        pts = np.sort((d[i] + d[j]) / 2)
    m = pts.size
    est = (float(pts[(m - 1) // 2]) + float(pts[m // 2])) / 2  # the median of sorted points
    k = max(k, 1)
    lo, hi = float(pts[k - 1]), float(pts[pts.size - k])
    return Interval(math.exp(est), math.exp(lo), math.exp(hi), achieved, level, n, statistic)


def interval_from_rounds(res: dict, a: str, b: str, level: float = LEVEL, statistic: str = "sign") -> Interval:
    """The interval for variant b against variant a from pairs.alternate_rounds' result (each
    round's parts summed)."""
    sa = [sum(parts) for parts in res["times"][a]]
    sb = [sum(parts) for parts in res["times"][b]]
    return paired_ratio_interval(sa, sb, level, statistic)


# -- the words -------------------------------------------------------------------------------------

def within_noise(iv) -> bool:
    """No saving (or loss) is supported: the interval includes 1 (a ratio Interval) or 0 (a
    Saving), or the rounds did not reach the requested level."""
    if isinstance(iv, Saving):
        return iv.within_noise
    return not iv.enough or iv.low <= 1.0 <= iv.high


def seconds_saved(iv: Interval, seconds: float) -> Saving:
    """The ratio interval as seconds saved on `seconds` (the step, or the part the change applies
    to): seconds × (1 - ratio); the interval's high ratio is the low saving."""
    s = float(seconds)
    return Saving(estimate=s * (1 - iv.estimate), low=s * (1 - iv.high), high=s * (1 - iv.low), of_s=s,
                  level=iv.level, n=iv.n, statistic=iv.statistic, within_noise=within_noise(iv))


def confidence(iv: Interval) -> str:
    """"low" when within noise; "high" when the interval's end nearest 1 is at least half the
    estimate's effect on the log scale (|log near| ≥ ½·|log estimate|); else "medium"."""
    if within_noise(iv):
        return "low"
    near = iv.high if iv.estimate < 1 else iv.low
    return "high" if abs(math.log(near)) >= 0.5 * abs(math.log(iv.estimate)) else "medium"


def tied(x, y) -> bool:
    """Two savings (or two ratio intervals) in the same unit whose intervals overlap: what the
    rounds support does not order them. (Overlap is the conservative test: intervals that do not
    overlap differ; ones that overlap a little may still differ under a paired test of the two.)"""
    return x.low <= y.high and y.low <= x.high


def min_rounds(level: float = LEVEL, statistic: str = "sign") -> int:
    """The fewest rounds whose widest interval reaches `level` (90%: 5 for both statistics)."""
    n = 1
    while _critical(statistic, n, level)[0] == 0:
        n += 1
    return n


def _planned(n: int, factor: float, floor: int) -> int | None:
    total = max(math.ceil(n * factor), floor)
    return None if total > MAX_PLANNED_ROUNDS else max(total - n, 0)


def rounds_to_exclude_one(iv: Interval) -> int | None:
    """More rounds that would likely make the interval exclude 1, assuming its estimate holds and
    its half-width toward 1 shrinks as 1/√n: n·(half / |log estimate|)² in all (at least the
    level's minimum), minus the n done; 0 when it already does; None when the estimate is 1 or
    more than MAX_PLANNED_ROUNDS would be needed."""
    floor = min_rounds(iv.requested, iv.statistic)
    if not within_noise(iv):
        return 0
    effect = abs(math.log(iv.estimate))
    if effect == 0:
        return None
    near = iv.high if iv.estimate < 1 else iv.low
    half = abs(math.log(near) - math.log(iv.estimate))
    return _planned(iv.n, (half / effect) ** 2 * 1.0001, max(floor, iv.n + 1))


def rounds_to_separate(x, y) -> tuple[int, int] | None:
    """More rounds for each of two tied savings (same unit) that would likely separate them,
    assuming their estimates hold and both half-widths facing the other shrink as 1/√n with the
    same factor f = ((half_x + half_y) / gap)²: (n_x·f - n_x, n_y·f - n_y), rounded up; (0, 0) when
    not tied; None when the estimates are equal or more than MAX_PLANNED_ROUNDS would be needed."""
    if not tied(x, y):
        return (0, 0)
    hi, lo = (x, y) if x.estimate >= y.estimate else (y, x)
    gap = hi.estimate - lo.estimate
    if gap <= 0:
        return None
    f = ((hi.estimate - hi.low) + (lo.high - lo.estimate)) / gap
    f = f * f * 1.0001
    more = [_planned(s.n, f, s.n + 1) for s in (x, y)]
    return None if None in more else (more[0], more[1])
