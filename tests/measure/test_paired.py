"""Paired rounds and their intervals (gpuprof.measure.pairs.alternate_rounds, gpuprof.measure.paired).

No wall-clock waiting: rounds come from a seeded RNG, the clock is injected."""

import itertools
import math

import numpy as np
import pytest

from gpuprof.measure import paired, pairs
from gpuprof.measure.paired import Interval, paired_ratio_interval

SIMS = 2000


# -- exact null distributions against brute force --------------------------------------------------

def _brute(n, stat):
    counts = {}
    for signs in itertools.product((0, 1), repeat=n):
        t = stat(signs)
        counts[t] = counts.get(t, 0) + 1
    return [counts.get(t, 0) for t in range(max(counts) + 1)]


@pytest.mark.parametrize("n", range(1, 11))
def test_null_counts_and_critical_ranks_match_a_brute_force_enumeration(n):
    ranks = _brute(n, lambda s: sum(r for r, pos in zip(range(1, n + 1), s) if pos))
    signs = _brute(n, sum)
    assert paired.signed_rank_counts(n) == ranks
    assert paired.sign_counts(n) == signs
    for counts in (ranks, signs):
        for level in (0.8, 0.9, 0.95):
            k, cov = paired.critical_rank(counts, level)
            tail = lambda k: sum(counts[:k]) / 2 ** n  # noqa: E731  P(T <= k-1)
            if k:
                assert 1 - 2 * tail(k) >= level and cov == pytest.approx(1 - 2 * tail(k))
                assert 1 - 2 * tail(k + 1) < level  # the largest such k
            else:
                assert 1 - 2 * tail(1) < level and cov == pytest.approx(1 - 2 * tail(1))


def test_published_wilcoxon_critical_values():
    # two-sided alpha 0.10: T <= 5 at n = 8, <= 17 at n = 12 (k = T + 1); alpha 0.05: T <= 8 at n = 10
    assert paired.critical_rank(paired.signed_rank_counts(8), 0.90)[0] == 6
    assert paired.critical_rank(paired.signed_rank_counts(12), 0.90)[0] == 18
    assert paired.critical_rank(paired.signed_rank_counts(10), 0.95)[0] == 9
    assert paired.min_rounds(0.90) == 5 and paired.min_rounds(0.95) == 6
    # the advised rounds: the fewest whose 90% sign interval is not the d's full range
    ks = {n: paired.critical_rank(paired.sign_counts(n), 0.90)[0] for n in range(5, 9)}
    assert ks == {5: 1, 6: 1, 7: 1, 8: 2} and paired.ADVISED_ROUNDS == 8


# -- coverage on a simulated noisy machine ---------------------------------------------------------

def _rounds(rng, n, ratio, spikes=0.0, spikes_b=None, sims=None):
    """Seconds of n rounds (`sims` rows of them when given): a drifting machine speed both variants
    share, 4% noise per run, and a spike (a run 1.2-2.5x slower) on each run with probability
    `spikes` (B's own rate if given)."""
    shape = (sims or 1, n)
    speed = np.exp(np.cumsum(rng.normal(0, 0.05, shape), axis=1))
    a = 0.2 * speed * np.exp(rng.normal(0, 0.04, shape))
    b = 0.2 * ratio * speed * np.exp(rng.normal(0, 0.04, shape))
    pb = spikes if spikes_b is None else spikes_b
    a *= np.where(rng.random(shape) < spikes, 1 + rng.uniform(0.2, 1.5, shape), 1.0)
    b *= np.where(rng.random(shape) < pb, 1 + rng.uniform(0.2, 1.5, shape), 1.0)
    return (a, b) if sims else (a[0], b[0])


def _intervals(rng, n, ratio, spikes=0.0, spikes_b=None, statistic="sign"):
    a, b = _rounds(rng, n, ratio, spikes, spikes_b, sims=SIMS)
    return [paired_ratio_interval(x, y, statistic=statistic) for x, y in zip(a, b)]


def _mc_floor(level):
    return level - 3 * math.sqrt(level * (1 - level) / SIMS)  # three Monte-Carlo standard errors


@pytest.mark.parametrize("n", [6, 8, 12])
@pytest.mark.parametrize("spikes,spikes_b", [(0.0, None), (0.1, None), (0.0, 0.1)])
def test_the_interval_covers_the_true_ratio_at_its_stated_level(n, spikes, spikes_b):
    rng = np.random.default_rng(1000 * n + int(100 * spikes) + (7 if spikes_b else 0))
    ivs = _intervals(rng, n, 0.9, spikes, spikes_b)
    assert all(iv.level >= 0.90 and iv.n == n for iv in ivs)
    assert sum(iv.low <= 0.9 <= iv.high for iv in ivs) / SIMS >= _mc_floor(0.90)


@pytest.mark.parametrize("n", [8, 12])
def test_the_wilcoxon_interval_covers_on_symmetric_noise(n):
    rng = np.random.default_rng(n)
    ivs = _intervals(rng, n, 0.9, statistic="wilcoxon")
    assert sum(iv.low <= 0.9 <= iv.high for iv in ivs) / SIMS >= _mc_floor(0.90)


@pytest.mark.parametrize("n,spikes", [(6, 0.0), (8, 0.1), (12, 0.0), (12, 0.1)])
def test_no_true_effect_is_within_noise_nine_times_in_ten(n, spikes):
    rng = np.random.default_rng(n + 31)
    noise = sum(paired.within_noise(iv) for iv in _intervals(rng, n, 1.0, spikes))
    assert noise / SIMS >= _mc_floor(0.90)


def test_a_real_saving_is_found_and_its_interval_holds_the_estimate():
    rng = np.random.default_rng(5)
    iv = paired_ratio_interval(*_rounds(rng, 12, 0.8))
    assert iv.low <= iv.estimate <= iv.high < 1 and not paired.within_noise(iv)
    assert iv.n == 12 and iv.statistic == "sign" and iv.enough and iv.level == pytest.approx(0.96142578125)
    assert Interval.from_dict(iv.as_dict()) == iv


# -- the words -------------------------------------------------------------------------------------

def _iv(est, low, high, n=12, level=0.93):
    return Interval(est, low, high, level, 0.90, n, "sign")


def test_too_few_rounds_claim_nothing():
    iv = paired_ratio_interval([1.0, 1.0, 1.0, 1.0], [0.5, 0.52, 0.51, 0.49])  # 4 rounds: 87.5% at most
    assert not iv.enough and iv.level == pytest.approx(0.875) and iv.high < 1
    assert paired.within_noise(iv) and paired.confidence(iv) == "low"
    assert paired.rounds_to_exclude_one(iv) == 1  # the fifth reaches 90%


def test_seconds_saved_on_a_step():
    s = paired.seconds_saved(_iv(0.8, 0.7, 0.9), 0.200)
    assert (s.estimate, s.low, s.high) == pytest.approx((0.040, 0.020, 0.060))
    assert s.of_s == 0.2 and not s.within_noise and not paired.within_noise(s)
    slower = paired.seconds_saved(_iv(1.1, 1.05, 1.2), 0.2)
    assert slower.high < 0 and not slower.within_noise  # a supported loss, not a saving
    assert paired.seconds_saved(_iv(0.95, 0.9, 1.01), 0.2).within_noise


def test_confidence_comes_from_the_interval():
    assert paired.confidence(_iv(0.8, 0.75, 0.85)) == "high"  # near end 0.85: log 0.163 >= half of 0.223
    assert paired.confidence(_iv(0.8, 0.6, 0.95)) == "medium"  # excludes 1, near end gives < half
    assert paired.confidence(_iv(0.8, 0.6, 1.02)) == "low"
    assert paired.confidence(_iv(1.25, 1.15, 1.3)) == "high"  # a slowdown is judged the same way


def test_tied_savings_overlap():
    a, b = paired.seconds_saved(_iv(0.8, 0.7, 0.9), 0.2), paired.seconds_saved(_iv(0.85, 0.8, 0.9), 0.2)
    assert paired.tied(a, b) and paired.tied(b, a)
    c = paired.seconds_saved(_iv(0.97, 0.95, 0.99), 0.2)
    assert not paired.tied(a, c) and paired.rounds_to_separate(a, c) == (0, 0)


def test_rounds_needed_follow_the_square_root_rule():
    # estimate 0.9 (effect 0.105 on the log scale), half-width toward 1: log(1.02 / 0.9) = 0.125
    iv = _iv(0.9, 0.8, 1.02, n=8)
    need = math.ceil(8 * (math.log(1.02 / 0.9) / math.log(1 / 0.9)) ** 2)
    assert paired.rounds_to_exclude_one(iv) == need - 8
    assert paired.rounds_to_exclude_one(_iv(0.9, 0.8, 0.95)) == 0
    assert paired.rounds_to_exclude_one(_iv(1.0, 0.9, 1.1)) is None
    assert paired.rounds_to_exclude_one(_iv(0.99, 0.5, 1.5)) is None  # far beyond the cap
    x, y = _iv(0.80, 0.70, 0.90, n=8), _iv(0.84, 0.75, 0.95, n=12)  # gap 0.04, facing halves 0.10 + 0.09
    assert paired.rounds_to_separate(x, y) is None  # 8·(0.19 / 0.04)² > 64
    x, y = _iv(0.80, 0.70, 0.88, n=8), _iv(0.86, 0.82, 0.95, n=12)  # gap 0.06, facing halves 0.08 + 0.04
    assert paired.rounds_to_separate(x, y) == (33 - 8, 49 - 12)  # f = (0.12 / 0.06)² = 4, just over
    assert paired.rounds_to_separate(x, x) is None


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        paired_ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_ratio_interval([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        paired_ratio_interval([1.0] * 6, [1.0] * 6, statistic="t")


# -- alternate_rounds under an injected clock ------------------------------------------------------

class Ticks:
    """`now` advances only by the spans it hands out; spans() returns each variant's set seconds."""

    def __init__(self, seconds):
        self.t, self.seconds, self.calls = 0.0, seconds, []

    def now(self):
        return self.t

    def sync(self):
        pass

    def spans(self, *fns):
        name = fns[0]
        self.calls.append(name)
        out = list(self.seconds[name])
        self.t += sum(out)
        return out


def _variants(*names):
    return {n: [n] for n in names}  # the "part" is its name: Ticks.spans sees which variant runs


def test_alternate_rounds_keeps_every_round_in_abba_order():
    clock = Ticks({"a": [0.3, 0.2], "b": [0.4]})
    res = pairs.alternate_rounds(clock, _variants("a", "b"), seconds=100.0, now=clock.now, max_rounds=6)
    assert res["rounds"] == 6 and res["order"] == [["a", "b"], ["b", "a"]] * 3
    assert clock.calls == ["a", "b"] + ["a", "b", "b", "a"] * 3  # warm-up, then ABBA
    assert res["times"]["a"] == [[0.3, 0.2]] * 6 and res["times"]["b"] == [[0.4]] * 6
    assert res["best"] == {"a": [0.3, 0.2], "b": [0.4]} and res["warm_up_s"] == pytest.approx(0.9)
    assert pairs.round_seconds(res, "a") == pytest.approx([0.5] * 6)
    iv = paired.interval_from_rounds(res, "a", "b")
    assert iv.estimate == pytest.approx(0.8) and iv.n == 6


def test_a_lead_in_runs_every_round_and_is_not_kept():
    clock = Ticks({"a": [0.5, 0.3], "b": [0.6, 0.4]})  # each variant: its lead-in part, then the timed one
    two_parts = {n: [n, n] for n in ("a", "b")}
    res = pairs.alternate_rounds(clock, two_parts, seconds=100.0, now=clock.now, max_rounds=4, lead_in=1)
    assert res["times"] == {"a": [[0.3]] * 4, "b": [[0.4]] * 4} and res["best"] == {"a": [0.3], "b": [0.4]}
    assert res["warm_up_s"] == pytest.approx(1.8)  # the deadline plans rounds with their lead-ins
    assert paired.interval_from_rounds(res, "a", "b").estimate == pytest.approx(0.4 / 0.3)
    with pytest.raises(ValueError, match="nothing to time"):
        pairs.alternate_rounds(Ticks({"a": [1.0], "b": [1.0]}), _variants("a", "b"), 100.0, lead_in=1)


def test_three_variants_reverse_their_order_every_other_round():
    clock = Ticks({"a": [0.1], "b": [0.1], "c": [0.1]})
    res = pairs.alternate_rounds(clock, _variants("a", "b", "c"), seconds=100.0, now=clock.now, max_rounds=3)
    assert res["order"] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_alternate_rounds_respects_the_deadline_and_keeps_pairs_of_rounds():
    clock = Ticks({"a": [1.0], "b": [1.0]})  # a round: 2 s; warm-up 2 s
    res = pairs.alternate_rounds(clock, _variants("a", "b"), seconds=13.0, now=clock.now)
    # 11 s after the warm-up: 4 rounds (8 s); a 5th would fit, but not the pair it would open
    assert res["rounds"] == 4 and clock.t <= 13.0
    clock = Ticks({"a": [1.0], "b": [1.0]})
    res = pairs.alternate_rounds(clock, _variants("a", "b"), seconds=7.0, now=clock.now)
    assert res["rounds"] == 2 and clock.t == 6.0  # at least 2 rounds, as alternate does
    res = pairs.alternate_rounds(Ticks({"a": [1.0], "b": [1.0]}), _variants("a", "b"), seconds=7.0,
                                 now=lambda: 0.0)  # a clock that never moves: the round cap ends it
    assert res["rounds"] == pairs.MAX_ROUNDS


def test_alternate_rounds_stops_when_asked():
    clock = Ticks({"a": [1.0], "b": [0.5]})
    res = pairs.alternate_rounds(clock, _variants("a", "b"), seconds=1000.0, now=clock.now, min_rounds=4,
                                 until=lambda r: not paired.within_noise(paired.interval_from_rounds(r, "a", "b")))
    assert res["rounds"] == 6  # 4 rounds give 87.5% at most; 6 exclude 1 (asked after even rounds)


def test_alternate_rounds_refuses_like_alternate_when_the_warm_up_leaves_no_room():
    for fn in (pairs.alternate, pairs.alternate_rounds):
        clock = Ticks({"a": [1.0], "b": [1.0]})
        with pytest.raises(TimeoutError):
            fn(clock, _variants("a", "b"), seconds=5.0, now=clock.now)
        assert clock.calls == ["a", "b"]  # the warm-ups only
