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

The compute fixes (attention, vocabulary, optimizer, compile) scale other parts of the step; their
intervals are not compared here.
"""

from __future__ import annotations

from gpuprof.measure.paired import (Interval, paired_ratio_interval, rounds_to_separate, seconds_saved, tied,
                                    within_noise)
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
    """One more round's seconds: the medians of both ways' rounds so far."""
    return sum(median(v) for v in d["round_seconds"].values())


def settle(sections: dict, ctx, budget) -> dict | None:
    """Spend what is left of `budget` on the rounds that would order the two tied fixes; None when
    nothing is tied (or the measurements are not there)."""
    switch = ((sections.get("probe") or {}).get("precisions") or {}).get("switch") or {}
    pair = (sections.get("microbatch") or {}).get("pair") or {}
    ivs = (_interval(switch), _interval(pair))
    if None in ivs or getattr(ctx, "model", None) is None:
        return None
    saved = [seconds_saved(iv, 1.0) for iv in ivs]  # per second of forward+backward
    if not tied(*saved):
        return None
    plan = rounds_to_separate(*saved)
    out = {"between": list(BETWEEN), "rounds_before": [iv.n for iv in ivs], "planned": list(plan) if plan else None,
           "rounds_added": [0, 0], "settled": False}
    seconds = budget.allot(NAME, 1.0)
    skipped: list[str] = []
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
    if not out["settled"]:
        skipped.append(f"the ranking of {BETWEEN[0]} and {BETWEEN[1]}: {out['why']}")
    budget.done(NAME, skipped)
    return out


def _rounds(d: dict, seconds: float, planned: int) -> int:
    """The rounds to ask for: the planned ones, as many as fit `seconds` after a warm-up (a round
    planned at 1.25x the rounds' medians), at least 2, at most MAX_ROUNDS."""
    fit = int(seconds / (1.25 * _round_s(d))) - 1
    return max(2, min(planned, fit, MAX_ROUNDS))


def _more(ctx, switch: dict, pair: dict, seconds: list[float], plan, out: dict) -> None:
    from gpuprof.measure.microbatch import time_pair
    from gpuprof.measure.precisions import time_steps_paired

    args, kwargs = tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {})
    try:
        more = time_steps_paired(ctx.model, args, ctx.device, switch["from"], switch["to"], seconds[0], kwargs,
                                 min_rounds=_rounds(switch, seconds[0], plan[0]))
        _pool(switch, switch["from"], switch["to"], more)
        switch["fwd_bwd_per_micro_s"] = median(switch["round_seconds"][switch["to"]])
        switch["eager_fwd_bwd_per_micro_s"] = median(switch["round_seconds"][switch["from"]])
        out["rounds_added"][0] = more["rounds"]
    except Exception as exc:  # noqa: BLE001 - TimeoutError (no room), a model that will not run again
        out["why"] = f"the precision rounds: {exc.__class__.__name__}: {exc}"
    try:
        more = time_pair(ctx.model, args, kwargs, ctx.device, ctx.autocast_dtype, pair["new_batch_size"], seconds[1],
                         min_rounds=_rounds(pair, seconds[1], plan[1]))
        _pool(pair, "run", "larger", more)
        out["rounds_added"][1] = more["rounds"]
    except Exception as exc:  # noqa: BLE001
        out["why"] = f"the micro-batch rounds: {exc.__class__.__name__}: {exc}"
