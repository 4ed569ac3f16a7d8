"""How the experiment steps of one fix are planned and when its timing ends
(gpuprof.measure.experiments runs them): the schedule of its steps (a warm-up with the fix on, then
pairs in ABBA order, each timed step after a step of its own way), how many pairs fit the time left,
and whether the pairs so far decide it. Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_PAIRS = 4  # fewer pairs give no 90% sign interval narrower than the pairs' full range
# A fix gets up to this many pairs while its time allows, and stops once decided (DECIDED_AFTER
# pairs at least): a loop's steps vary ±15% on a loaded 2-core VM; 8 pairs could not resolve a
# fused optimizer's 5% there.
MAX_PAIRS = 64
# At 6 pairs the 90% sign interval is their whole range (8 pairs: the 2nd smallest to the 2nd largest):
# decided there only when all six ratios lie within ±DECIDED_HALF (or a third of the saving). Each pair
# costs 3 steps (a lead before each way: `schedule`); in one diagnose here fused AdamW's first 6 ratios
# spanned ±1.3 points.
DECIDED_AFTER = 6
# ... and once its interval is narrow enough to promise: the ratio's interval at most ±DECIDED_HALF
# of the step (issue #41: a promise within ±5 points of the step; 4 leaves the profile's step times,
# which decide the result, room to differ from the host times that end the timing). Until then it
# runs on within its share of the budget: fused AdamW decided at 8-23 pairs gave half-widths of
# 3.3-6.6 points (docs/measurements/2026-12-07-loop-experiments.md).
DECIDED_HALF = 0.04
# A large saving needs no ±4 points: issue #41's bar for a claim is max(5 points, half of it), so a
# fix whose interval is within a third of its own saving (and within ±DECIDED_HALF or wider) is
# decided too. On the by-hand attention case (a ~17% saving) the ±4-point rule took 18-22 pairs,
# ~3 s of a ~15 s diagnose; a third of the saving was reached at 8 (the wall time of a default
# diagnose is bounded at 1.25x the one before the experiments).
DECIDED_REL = 1 / 3


# An interval that holds no change ends the timing only once it also rules out a change of this
# share of the step either way (issue #41: a fix that saves 5% or more must not go unclaimed): at 6
# pairs, fused AdamW's [0.941, 1.014] was ±3.6 points wide and would have stopped unclaimed.
RULED_OUT = 0.05


def decided_width(iv) -> bool:
    """Whether a ratio interval is decided: its half-width at most ±DECIDED_HALF of the step, or at
    most DECIDED_REL of the saving (or slowdown) it estimates; and, where it holds no change, it
    rules out a change of RULED_OUT either way."""
    half = (iv.high - iv.low) / 2
    if half > max(DECIDED_HALF, DECIDED_REL * abs(1.0 - iv.estimate)):
        return False
    if iv.low <= 1.0 <= iv.high:
        return 1.0 - iv.low < RULED_OUT and iv.high - 1.0 < RULED_OUT
    return True


@dataclass
class _Planned:
    switch: object
    pairs: int
    steps: list = field(default_factory=list)  # [(way, timed)] in order


def schedule(pairs: int, warmup: int) -> list[tuple[str, bool]]:
    """One experiment's steps: `warmup` with the fix (b), then `pairs` pairs in ABBA order:
    (a, b), (b, a), (a, b), ... Each entry (way, timed). A timed step always follows a step of its
    own way: where the step before it ran the other way, an untimed step of its way comes first
    (a lead), so (after the warm-up) the schedule runs b, a, a, b, b | b, a, a | a, b, b | ...

    The first step after a switch runs cold (the allocator holds the other way's blocks; why exactly
    is not measured). On the by-hand attention fixture (tests/fixtures/mingpt_train.py, one thread,
    this project's EPYC VM), adjacent single steps ABBA gave SDPA ÷ by-hand 0.776 and 0.787 in one
    process whose steps in runs (each way's first untimed) gave 0.932 and 0.936, and in blocks of 15
    0.915 and 0.987: a 15-point saving that the loop, whose steps never switch, does not have
    (benchmarks/loop_alternation.py, another process: single 0.832/0.850, leads 0.937/0.892). The
    fused optimizer's phase showed none (0.33/0.30 single, 0.33/0.34 in runs, 0.32/0.31 in blocks),
    but a lead costs one step per pair and holds for every fix."""
    steps = [("b", False)] * warmup
    prev = "b" if warmup else None  # before the first: unknown (another fix's step, or the run's)
    for i in range(pairs):
        for way in (("a", "b") if i % 2 == 0 else ("b", "a")):
            if prev != way:
                steps.append((way, False))
            steps.append((way, True))
            prev = way
    return steps


def steps_needed(pairs: int, warmup: int) -> int:
    """len(schedule(pairs, warmup)): the warm-up, 4 steps for the first pair, 3 for each next one."""
    return warmup + 3 * pairs + 1 if pairs else warmup


SLOWDOWN = 1.25  # a fix may make a step slower: each experiment is costed at this much of the run's step


def plan_one(switch, step_s: float, seconds: float, slowdown: float = SLOWDOWN) -> tuple[_Planned | None, str]:
    """The experiment of `switch` within `seconds` (steps of ~step_s, each costed `slowdown` times
    that): as many pairs as fit, up to MAX_PAIRS; or None and why not."""
    pairs = MAX_PAIRS if step_s > 0 else 0
    while pairs >= MIN_PAIRS and steps_needed(pairs, switch.warmup_steps) * step_s * slowdown > seconds:
        pairs -= 1
    if pairs < MIN_PAIRS:
        return None, (f"{switch.id}: {MIN_PAIRS} pairs of ~{step_s:.2f} s steps (each way once, each after a "
                      f"step of its own way) do not fit the {max(seconds, 0):.1f} s left")
    return _Planned(switch, pairs, schedule(pairs, switch.warmup_steps)), ""
