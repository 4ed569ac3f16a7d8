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


def timed_saving(interval: dict | None, of_s: float, ratio: float, why_none: str = "") -> TimedSaving:
    """The saving on `of_s` seconds per step (the part of the step the change scales) from the
    stored ratio interval; without one, from the point `ratio`. `why_none`: why there is no
    interval (default: a profile written before paired rounds)."""
    iv = interval_of(interval)
    if iv is None or not iv.enough:
        est = of_s * (1 - (iv.estimate if iv is not None else ratio))
        why = (f"{iv.n} paired rounds, too few for a {iv.requested:.0%} interval" if iv is not None else
               why_none or "the profile has no paired rounds (written before them)")
        return TimedSaving(est, est, "low", evidence={"interval_measured": False, "rounds": iv.n if iv else None},
                           note=f"interval not measured: {why}; the point figure, confidence low")
    s = seconds_saved(iv, of_s)
    ev = {"saving_low_s": s.low, "saving_high_s": s.high, "interval_level": s.level, "rounds": s.n,
          "interval_statistic": s.statistic, "within_noise": s.within_noise, "ratio_low": iv.low,
          "ratio_high": iv.high}
    words = interval_text(s.low, s.high, s.level, s.n)
    if s.within_noise:
        return TimedSaving(s.estimate, None, "low", True, ev,
                           note=(f"within this machine's noise: {words} per step, an interval that holds no "
                                 f"change (estimate {seconds(s.estimate)}); no saving claimed"))
    return TimedSaving(s.estimate, s.estimate, confidence(iv), False, ev,
                       note=f"saving {seconds(s.estimate)} per step ({words}, sign-test interval of paired rounds)")
