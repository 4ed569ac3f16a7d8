"""A saving timed in paired rounds, as a rule claims it (issue #29; docs/savings-intervals.md).

The measuring side stores the ratio's interval (changed way ÷ run's way, measure/paired.py
`Interval.as_dict`) beside the timing; `timed_saving` turns it into seconds per step on the part of
the step the change scales, and decides what may be claimed:
- the interval excludes no change: the estimate is claimed, with `confidence(iv)` and the interval
  in the evidence (`saving_low_s`, `saving_high_s`, `interval_level`, `rounds`);
- it includes no change: no saving (`saving_s` None), confidence "low", the interval in the
  evidence and "within this machine's noise" in the note;
- no interval (a profile written before paired rounds, or too few rounds for its level): the point
  figure the ratio gives, confidence "low", and the note says the interval was not measured.

The transfer (`timed_s`): the rounds time the change after the run, eagerly, on work that should be
the run's part `of_s`; where the run's way took `timed_s` there (its rounds' median, at the step's
scale) and that differs from `of_s`, the rounds do not say whether the change scales the run's part
(of_s × (1 − ratio), the estimate) or removes the seconds it removed there (timed_s × (1 − ratio)).
The promised interval then spans both: from the lower to the higher of the two products at each
end of the ratio's interval, the high end at most of_s (no more saved than the part holds). On
the advice_repeat benchmark the eager model ran 0.8–1.25× the run's own micro-step, and the
ratio-only interval (±1–2%) held the achieved saving in 0 of 5 runs (docs/measurements).

The share of the step (`share_bounds`, evidence `share_low`/`share_high`): each of the two
readings is divided by the step it belongs to. The run's reading, of_s × (1 − ratio), is a share
of the run's step; the rounds' reading, timed_s × (1 − ratio), is a share of the step the run
would have had with the rounds' seconds for that part (step − of_s + timed_s). Dividing the rounds'
seconds by the run's step mixed two speeds: where the rounds ran the model 1.37× slower than the
loop had (the bf16 step on an EPYC without native bf16), the share reached 98.6% for a fix whose
plain reruns saved 84.4–86.7%; per reading it is 84.6–85.7% (docs/measurements/2026-12-03-advice-repeat.md,
the evening series). A seconds figure still spans both readings at the run's speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.measure.paired import Interval, confidence, seconds_saved
from gpuprof.units import interval_text, seconds


@dataclass(frozen=True)
class TimedSaving:
    estimate: float  # seconds per step the ratio's estimate gives (negative: the change is slower)
    saving_s: float | None  # what may be claimed: None within noise
    confidence: str
    within_noise: bool = False
    evidence: dict = field(default_factory=dict)
    note: str = ""


def interval_of(d) -> Interval | None:
    """The stored interval (Interval.as_dict), or None when absent or unreadable."""
    if not isinstance(d, dict):
        return None
    try:
        return Interval.from_dict(d)
    except (KeyError, TypeError):
        return None


def share_bounds(iv: Interval, of_s: float, timed_s: float | None, step_s: float | None,
                 extra_high_s: float = 0.0) -> tuple[float, float] | None:
    """(low, high) shares of the step the saving's interval gives, each reading over its own step
    (the module's docstring): the run's part of_s over step_s and, where the transfer spans, the
    rounds' timed_s over step_s − of_s + timed_s. `extra_high_s`: untimed seconds the high end
    adds (the loop code fewer micro-steps run less often). None without a step."""
    if not step_s or step_s <= 0:
        return None
    worlds = [(of_s, step_s)]
    if transfer_spans(of_s, timed_s):
        worlds.append((timed_s, step_s - of_s + timed_s))
    low = min(part * (1 - iv.high) / step for part, step in worlds)
    high = max((min(part * (1 - iv.low), part) + extra_high_s) / step for part, step in worlds)
    return low, min(high, 1.0)


def timed_saving(interval: dict | None, of_s: float, ratio: float, why_none: str = "",
                 timed_s: float | None = None, step_s: float | None = None) -> TimedSaving:
    """The saving on `of_s` seconds per step (the part of the step the change scales) from the
    stored ratio interval; without one, from the point `ratio`. `why_none`: why there is no
    interval (default: a profile written before paired rounds). `timed_s`: the seconds per step the
    run's way took in the rounds for the same work, when known (the interval then spans the
    transfer, above). `step_s`: the typical step, for the interval as shares of it (evidence
    share_low/share_high, `share_bounds`)."""
    iv = interval_of(interval)
    if iv is None or not iv.enough:
        est = of_s * (1 - (iv.estimate if iv is not None else ratio))
        why = (f"{iv.n} paired rounds, too few for a {iv.requested:.0%} interval" if iv is not None else
               why_none or "the profile has no paired rounds (written before them)")
        return TimedSaving(est, est, "low", evidence={"interval_measured": False, "rounds": iv.n if iv else None},
                           note=f"interval not measured: {why}; the point figure, confidence low")
    s = seconds_saved(iv, of_s)
    low, high = s.low, s.high
    ev = {"interval_level": s.level, "rounds": s.n, "interval_statistic": s.statistic,
          "within_noise": s.within_noise, "ratio_low": iv.low, "ratio_high": iv.high}
    spans = transfer_spans(of_s, timed_s)
    if spans:
        t = seconds_saved(iv, timed_s)
        # never more saved than the run's part holds (the rounds' seconds may be the larger)
        low, high = min(low, t.low), min(max(high, t.high), of_s)
        ev.update(timed_part_s=timed_s, ratio_saving_low_s=s.low, ratio_saving_high_s=s.high)
    ev.update(saving_low_s=low, saving_high_s=high)
    shares = share_bounds(iv, of_s, timed_s, step_s)
    if shares is not None:
        ev.update(share_low=shares[0], share_high=shares[1])
    words = interval_text(low, high, s.level, s.n)
    how = ("sign-test interval of paired rounds, spanning the change applied as a ratio to the run's "
           f"{seconds(of_s)} and as the rounds' difference on their {seconds(timed_s)}" if spans
           else "sign-test interval of paired rounds")
    if s.within_noise:
        return TimedSaving(s.estimate, None, "low", True, ev,
                           note=(f"within this machine's noise: {words} per step, an interval that holds no "
                                 f"change (estimate {seconds(s.estimate)}); no saving claimed"))
    return TimedSaving(s.estimate, s.estimate, confidence(iv), False, ev,
                       note=f"saving {seconds(s.estimate)} per step ({words}, {how})")


TRANSFER_TOL = 0.02  # the timed part within 2% of the run's: one figure, no span


def transfer_spans(of_s: float, timed_s: float | None) -> bool:
    """The rounds' own seconds for the run's way differ from the run's part by more than 2%."""
    return bool(timed_s and of_s and timed_s > 0 and abs(timed_s / of_s - 1) > TRANSFER_TOL)
