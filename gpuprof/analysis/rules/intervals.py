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


def timed_saving(interval: dict | None, of_s: float, ratio: float, why_none: str = "",
                 timed_s: float | None = None) -> TimedSaving:
    """The saving on `of_s` seconds per step (the part of the step the change scales) from the
    stored ratio interval; without one, from the point `ratio`. `why_none`: why there is no
    interval (default: a profile written before paired rounds). `timed_s`: the seconds per step the
    run's way took in the rounds for the same work, when known (the interval then spans the
    transfer, above)."""
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
