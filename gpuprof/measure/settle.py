"""More paired rounds where the ranking is undecided (issue #29; docs/savings-intervals.md).

After every post-run part has run, what is left of the budget goes where it decides the ranking:
when the precision switch (probe.precisions.switch) and the larger micro-batch (microbatch.pair)
both support a saving and their intervals overlap, the order of the two fixes is not measured.
Both savings scale the same part of the step (forward+backward per step: rules/precision.py and
rules/batching.py pass it to `timed_saving`), so their intervals compare as ratios, and
`paired.rounds_to_separate` plans how many more rounds each needs. Those rounds are timed with
the same functions (precisions.time_steps_paired, microbatch.time_pair), pooled with the first
ones (every round is an independent ABBA pair) and the intervals recomputed. The section `settle`
says what was tied, the rounds added, and whether the ranking was settled; when the budget ran
out first, the report says so.

Then what is still left goes to a saving the rounds could not decide: the precision switch or the
larger micro-batch whose interval holds no change while its estimate is a saving
(`paired.rounds_to_exclude_one` plans the rounds that would likely decide it, at most
MAX_PLANNED_ROUNDS in all). Those rounds are pooled the same way and the interval says what it says
after them: a saving, or still within noise. `settle["noise"]` keeps, per fix, the rounds before,
planned and added, and whether it is still within noise. One look more at the data than a single
interval gives (the rounds are extended once, after seeing they were undecided): the chance that
a null effect ends claimed rises a little above the 10% a single 90% interval allows; the rounds
are never extended again and never cut short, so it is one extension, not a sequential test.

The compute fixes (attention, vocabulary, optimizer, compile) scale other parts of the step; their
intervals are neither compared nor extended here.
"""

from __future__ import annotations

from gpuprof.measure.paired import (Interval, paired_ratio_interval, rounds_to_exclude_one, rounds_to_separate,
                                    seconds_saved, tied, within_noise)
from gpuprof.measure.pairs import MAX_ROUNDS
from gpuprof.stats import median

NAME = "settle"
BETWEEN = ("precision-slow", "micro-batch-too-small")


def _interval(d: dict) -> Interval | None:
    try:
        iv = Interval.from_dict(d.get("interval"))
    except (KeyError, TypeError, AttributeError):
        return None
    return iv if iv.enough and not within_noise(iv) and iv.estimate < 1 else None


def _pool(d: dict, a: str, b: str, more: dict) -> Interval:
    """d's rounds and `more`'s pooled; d updated in place: interval, rounds, round_seconds, ratio."""
    secs = {w: list(d["round_seconds"][w]) + list(more["round_seconds"][w]) for w in (a, b)}
    iv = paired_ratio_interval(secs[a], secs[b])
    d.update(interval=iv.as_dict(), rounds=iv.n, round_seconds=secs, ratio=iv.estimate,
             settle_rounds=more["rounds"])
    return iv


def _round_s(d: dict) -> float:
    """One more round's seconds: what the timing planned (`round_s`: its untimed calls included),
    else the medians of both ways' rounds so far."""
    return d.get("round_s") or sum(median(v) for v in d["round_seconds"].values())


def _undecided(d: dict) -> Interval | None:
    """The interval when it reached its level, holds no change and its estimate is a saving."""
    try:
        iv = Interval.from_dict(d.get("interval"))
    except (KeyError, TypeError, AttributeError):
        return None
    return iv if iv.enough and within_noise(iv) and iv.estimate < 1 else None


def settle(sections: dict, ctx, budget) -> dict | None:
    """Spend what is left of `budget` on the rounds that would order the two tied fixes, then on
    those that would decide a saving still within noise; None when there is neither (or the
    measurements are not there)."""
    switch = ((sections.get("probe") or {}).get("precisions") or {}).get("switch") or {}
    pair = (sections.get("microbatch") or {}).get("pair") or {}
    if getattr(ctx, "model", None) is None:
        return None
    ivs = (_interval(switch), _interval(pair))
    is_tie = None not in ivs and tied(*(seconds_saved(iv, 1.0) for iv in ivs))
    noisy = [(fix, d, iv, rounds_to_exclude_one(iv)) for fix, d in zip(BETWEEN, (switch, pair))
             for iv in [_undecided(d)] if iv is not None]
    noisy = [x for x in noisy if x[3]]  # None: more than MAX_PLANNED_ROUNDS would be needed
    if not is_tie and not noisy:
        return None
    out: dict = {}
    skipped: list[str] = []
    seconds = budget.allot(NAME, 1.0)
    if is_tie:
        out.update(_settle_tie(ctx, switch, pair, ivs, seconds))
        if not out["settled"]:
            skipped.append(f"the ranking of {BETWEEN[0]} and {BETWEEN[1]}: {out['why']}")
    if noisy:
        out["noise"] = [_decide(ctx, fix, d, iv, planned, budget.left(), skipped) for fix, d, iv, planned in noisy]
    budget.done(NAME, skipped)
    return out


def _settle_tie(ctx, switch: dict, pair: dict, ivs, seconds: float) -> dict:
    saved = [seconds_saved(iv, 1.0) for iv in ivs]  # per second of forward+backward
    plan = rounds_to_separate(*saved)
    out = {"between": list(BETWEEN), "rounds_before": [iv.n for iv in ivs], "planned": list(plan) if plan else None,
           "rounds_added": [0, 0], "settled": False}
    cost = [max(n, 2) * _round_s(d) for n, d in zip(plan or (0, 0), (switch, pair))]
    if plan is None or sum(cost) == 0:
        out["why"] = "the two estimates are too close to separate within the rounds the budget could hold"
    elif seconds < 3 * min(_round_s(switch), _round_s(pair)):
        out["why"] = f"{seconds:.1f} s left in the post-run budget"
    else:
        _more(ctx, switch, pair, [seconds * c / sum(cost) for c in cost], plan, out)
        ivs = (_interval(switch), _interval(pair))
        out["settled"] = None not in ivs and not tied(*(seconds_saved(iv, 1.0) for iv in ivs))
        if not out["settled"] and "why" not in out:
            out["why"] = "the post-run budget ran out"
    return out


def _decide(ctx, fix: str, d: dict, iv: Interval, planned: int, seconds: float, skipped: list[str]) -> dict:
    """More rounds for one saving still within noise, as many as planned and fit `seconds`."""
    out = {"fix": fix, "rounds_before": iv.n, "planned": planned, "rounds_added": 0}
    if seconds < 4 * _round_s(d):  # a warm-up and the fewest rounds (2), with room
        out["why"] = f"{seconds:.1f} s left in the post-run budget"
    else:
        try:
            more = (_more_switch if fix == BETWEEN[0] else _more_pair)(ctx, d, seconds, _rounds(d, seconds, planned))
            out["rounds_added"] = more["rounds"]
        except Exception as exc:  # noqa: BLE001 - TimeoutError (no room), a model that will not run again
            out["why"] = f"{exc.__class__.__name__}: {exc}"
    now = Interval.from_dict(d["interval"])
    out["within_noise"] = within_noise(now)
    if out["within_noise"] and out["rounds_added"] < planned:
        out.setdefault("why", "the post-run budget ran out")
        skipped.append(f"{fix}: {out['rounds_added']} of the {planned} more paired rounds planned to decide it "
                       f"({out['why']})")
    return out


def _rounds(d: dict, seconds: float, planned: int) -> int:
    """The rounds to ask for: the planned ones, as many as fit `seconds` after a warm-up (a round
    planned at 1.25x the rounds' medians), at least 2, at most MAX_ROUNDS."""
    fit = int(seconds / (1.25 * _round_s(d))) - 1
    return max(2, min(planned, fit, MAX_ROUNDS))


def _more_switch(ctx, switch: dict, seconds: float, rounds: int) -> dict:
    """More precision rounds, pooled into `switch` (its interval, rounds and seconds updated)."""
    from gpuprof.measure.precisions import time_steps_paired

    args, kwargs = tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {})
    more = time_steps_paired(ctx.model, args, ctx.device, switch["from"], switch["to"], seconds, kwargs,
                             min_rounds=rounds)
    _pool(switch, switch["from"], switch["to"], more)
    switch["fwd_bwd_per_micro_s"] = median(switch["round_seconds"][switch["to"]])
    switch["eager_fwd_bwd_per_micro_s"] = median(switch["round_seconds"][switch["from"]])
    return more


def _more_pair(ctx, pair: dict, seconds: float, rounds: int) -> dict:
    """More micro-batch rounds, pooled into `pair`."""
    from gpuprof.measure.microbatch import time_pair

    args, kwargs = tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {})
    more = time_pair(ctx.model, args, kwargs, ctx.device, ctx.autocast_dtype, pair["new_batch_size"], seconds,
                     min_rounds=rounds)
    _pool(pair, "run", "larger", more)
    return more


def _more(ctx, switch: dict, pair: dict, seconds: list[float], plan, out: dict) -> None:
    try:
        out["rounds_added"][0] = _more_switch(ctx, switch, seconds[0], _rounds(switch, seconds[0], plan[0]))["rounds"]
    except Exception as exc:  # noqa: BLE001 - TimeoutError (no room), a model that will not run again
        out["why"] = f"the precision rounds: {exc.__class__.__name__}: {exc}"
    try:
        out["rounds_added"][1] = _more_pair(ctx, pair, seconds[1], _rounds(pair, seconds[1], plan[1]))["rounds"]
    except Exception as exc:  # noqa: BLE001
        out["why"] = f"the micro-batch rounds: {exc.__class__.__name__}: {exc}"
