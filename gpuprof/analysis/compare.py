"""Before/after: what changed between two profiles, and whether BEFORE's predicted savings came true.

Pure functions over two Profiles and their Analyses; nothing here runs, prints or analyses.
Statistics, the same as every other part of gpuprof (gpuprof.stats):
- the step time is the typical step (on the GPU timeline on CUDA, else host wall time: the mean
  of the steps that are not irregular); tokens/s is tokens per step / that step; the step delta,
  the seconds per 1M tokens and the --fail-if-slower gate all use it;
- a phase's seconds are its mean per typical step (which the typical step is the sum of, and
  the one the rules predict savings from).

The basis. Runs with the same tokens per step are compared per step. When the tokens per step
differ, a step is not the same amount of work: the times are compared per token (seconds per 1M
tokens) and the result says so (`basis`). A finding's predicted saving is seconds per BEFORE
step, so its achieved saving is expressed the same way: AFTER's per-token time × BEFORE's tokens
per step.

Achieved saving of a finding of BEFORE. Its `claims` name the phases the saving comes out of
(phase -> seconds per step). When it has claims that cover its whole saving, achieved = the drop
in those phases, BEFORE − AFTER (mean seconds per step, on the basis above): the fix acts on
those phases, and their drop is measured with far less noise than the whole step's. The change
in the other phases is reported beside it (`other_phases_change_s`), so a fix that moved time
elsewhere (a background loader slowing the compute on a CPU) is visible. Without claims (or a
saving partly outside them), achieved = the drop of the typical step, BEFORE − AFTER. A saving
timed in paired rounds (evidence saving_low_s/high_s, issue #29) is judged against its interval,
one without on ±15% of its point figure (`judged_by`). The step change's interval: the runs'
typical steps are independent samples, so AFTER ÷ BEFORE is the Hodges–Lehmann shift of the log
step times with its exact Mann–Whitney interval (docs/compare.md says why).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from gpuprof.analysis.config_diff import settings_changes
from gpuprof.analysis.findings import Finding
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.errors import GpuprofError
from gpuprof.profile import Profile
from gpuprof.stats import PHASES, StepStats, step_times
from gpuprof.units import NM, finite

PER_TOKENS = 1_000_000  # per-token figures are seconds per this many tokens
REALISED_TOL = 0.15  # achieved within ±15% of predicted is "realised" (issue #13's bar)
NOT_REALISED_BELOW = 0.15  # achieved under 15% of predicted: the saving did not happen
CLAIMS_COVER = 0.99  # claims summing to ≥ 99% of the saving cover it (rounding)
LEVEL = 0.90  # the step change's interval, at the savings' level (measure/paired.py)
MAX_STEPS = 200  # per run: more steps are thinned evenly in time (the exact null grows as m²·n)


@dataclass
class Figure:
    """One figure before and after; None where a profile did not measure it."""

    before: float | None
    after: float | None

    @property
    def change(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def change_pct(self) -> float | None:
        """Relative change as a fraction of BEFORE (0.12 = 12% more)."""
        return None if self.change is None or not self.before else self.change / self.before

    def to_dict(self) -> dict:
        return {"before": self.before, "after": self.after, "change": self.change,
                "change_pct": self.change_pct}


@dataclass
class PhaseChange:
    """A phase's mean time per unit (see Comparison.unit) and its share of the step."""

    phase: str
    time: Figure
    share: Figure

    def to_dict(self) -> dict:
        return {"phase": self.phase, "time": self.time.to_dict(), "share": self.share.to_dict()}


@dataclass
class Outcome:
    """Whether a finding of BEFORE was realised in AFTER. Seconds are per BEFORE step."""

    id: str
    title: str
    kind: str
    predicted_s: float | None  # BEFORE's saving_s (None: the rule did not estimate one)
    achieved_s: float | None
    ratio: float | None  # achieved / predicted
    measured_from: str | None  # "phases" (its claims) or "step" (the step delta)
    phases: list[str]  # the claimed phases achieved was measured from
    other_phases_change_s: float | None  # change of the unclaimed phases (+ = slower), per BEFORE step
    verdict: str
    in_after: bool  # AFTER still has a finding with this id
    after_saving_s: float | None  # its saving there
    overlaps: list[str] = field(default_factory=list)
    judged_by: str | None = None  # "interval" (the promised interval) or "tolerance" (±15%)
    promised_low_s: float | None = None  # the saving's interval, when it was timed in rounds
    promised_high_s: float | None = None
    interval_level: float | None = None
    rounds: int | None = None
    within_noise: bool | None = None  # BEFORE's timing held no change: no saving was promised

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepChange:
    """AFTER's typical step ÷ BEFORE's on the basis (per step, or per token): the Hodges–Lehmann
    estimate and interval (ratios), the coverage achieved (`level`), the steps of each run."""

    estimate: float
    low: float
    high: float
    level: float
    requested: float
    n_before: int
    n_after: int
    statistic: str = "hodges-lehmann/mann-whitney"

    @property
    def enough(self) -> bool:  # the steps were enough for the requested level
        return self.level >= self.requested - 1e-12

    @property
    def within_noise(self) -> bool:  # the interval holds no change, or too few steps for the level
        return not self.enough or self.low <= 1.0 <= self.high

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update({f"{k}_pct": (d[k] - 1.0) * 100.0 for k in ("estimate", "low", "high")})
        return {**d, "enough": self.enough, "within_noise": self.within_noise}


@dataclass
class Comparison:
    before_name: str
    after_name: str
    basis: str  # "step" or "token"
    unit: str  # "s/step" or "s/1M tokens": the unit of `time` and of every phase time
    basis_note: str
    tokens_per_step: Figure
    step_s: Figure  # the typical step, always per step
    time: Figure  # the basis figure: step_s, or seconds per 1M tokens
    tokens_per_s: Figure
    mfu: Figure
    mfu_vs_ceiling: Figure
    spread: Figure  # (p90 - p10) / median of the typical steps' times
    world_size: Figure
    timeline: tuple[str | None, str | None]
    phases: list[PhaseChange]
    outcomes: list[Outcome]
    new_findings: list[dict]
    config_changes: list[dict]
    notes: list[str]
    not_measured: dict  # figure -> why, for the figures a profile lacks
    step_change: StepChange | None = None  # None: a run had no step time above zero

    @property
    def slower_pct(self) -> float | None:
        """How much slower AFTER is, in percent, on the basis (negative: faster)."""
        c = self.time.change_pct
        return None if c is None else c * 100.0

    def to_dict(self) -> dict:
        figures = ("tokens_per_step", "step_s", "time", "tokens_per_s", "mfu", "mfu_vs_ceiling", "spread",
                   "world_size")
        d = {k: v for k, v in asdict(self).items() if k not in figures + ("phases", "outcomes", "step_change")}
        d.update({key: getattr(self, key).to_dict() for key in figures})
        d.update(timeline=list(self.timeline), phases=[p.to_dict() for p in self.phases],
                 findings=[o.to_dict() for o in self.outcomes], slower_pct=self.slower_pct,
                 step_change=None if self.step_change is None else self.step_change.to_dict())
        return d


def compare(before: Profile, before_analysis, after: Profile, after_analysis, *,
            before_name: str = "BEFORE", after_name: str = "AFTER") -> Comparison:
    """Compare two profiles and their analyses (see the module docstring for the statistics and
    the basis). A profile without a measured step is a GpuprofError (nothing to compare)."""
    for prof, name in ((before, before_name), (after, after_name)):
        if prof.stats is None or not prof.stats.step_s:
            raise GpuprofError(f"{name}: no measured step to compare")
    sb, sa = before.stats, after.stats
    ws_b, ws_a = world_size(before), world_size(after)
    # The job's tokens per step: a data-parallel step processes every rank's (the stats' tokens
    # per step are one rank's), so 1 rank of 1024 and 2 ranks of 512 do the same work per step.
    tok_b = (sb.tokens_per_step or 0) * ws_b or None
    tok_a = (sa.tokens_per_step or 0) * ws_a or None
    notes: list[str] = []
    per_token = bool(tok_b and tok_a and tok_b != tok_a)
    if per_token:
        basis, unit = "token", "s/1M tokens"
        basis_note = (f"tokens per step differ ({tok_b:,} → {tok_a:,}): times are compared per token "
                      f"(seconds per 1M tokens); a finding's seconds are per BEFORE step of {tok_b:,} tokens")
    else:
        basis, unit = "step", "s/step"
        if tok_b and tok_a:
            basis_note = f"same tokens per step ({tok_b:,}): compared per step"
        else:
            lacking = " and ".join(n for n, t in ((before_name, tok_b), (after_name, tok_a)) if not t)
            basis_note = f"tokens per step not measured ({lacking}): compared per step"
    # scale[i]: multiplies a per-step time of profile i into the basis unit
    scale_b = PER_TOKENS / tok_b if per_token else 1.0
    scale_a = PER_TOKENS / tok_a if per_token else 1.0
    # to_before: multiplies an AFTER per-step time into seconds per BEFORE step
    to_before = tok_b / tok_a if per_token else 1.0

    step = Figure(sb.step_s, sa.step_s)
    time = Figure(sb.step_s * scale_b, sa.step_s * scale_a)
    not_measured: dict[str, str] = {}
    mfu, mfu_c = _mfu(before_analysis.mfu, after_analysis.mfu, before_name, after_name, not_measured)
    if ws_b != ws_a:
        notes.append(f"world size changed {ws_b} → {ws_a}: tokens per step and tokens/s are the whole "
                     "job's (one rank's × the world size); the step and the phases are one rank's view "
                     "(for a merged profile, the rank gpuprof merge put there)")
    tl = (sb.timeline, sa.timeline)
    if tl[0] != tl[1]:
        notes.append(f"the step times are on different clocks: BEFORE {tl[0]}, AFTER {tl[1]} timeline")
    for stats, name in ((sb, before_name), (sa, after_name)):
        if stats.irregular:
            notes.append(f"{name} had {len(stats.irregular)} irregular step(s), left out of its typical step "
                         f"(the mean step with them: {stats.mean_s:.4g} s)")
    dev_b, dev_a = before.environment.get("device_name"), after.environment.get("device_name")
    if dev_b and dev_a and dev_b != dev_a:
        notes.append(f"different devices: {dev_b} → {dev_a}")
    # the typical steps' spread: an eval step is named irregular, not run-to-run noise
    spread = Figure(sb.typical_spread, sa.typical_spread)
    change = step_change(typical_times(before), typical_times(after), to_before)
    noise = max((x for x in (spread.before, spread.after) if x is not None), default=None)
    if noise and time.change_pct is not None and abs(time.change_pct) < noise and not (change and change.enough):
        notes.append(f"the {'time per token' if per_token else 'step time'} changed by "
                     f"{time.change_pct:+.1%}, less than the runs' own typical-step spread "
                     f"(p10–p90 {noise:.0%} of the median): within run-to-run noise")
    phases = phase_changes(sb, sa, scale_b, scale_a)
    return Comparison(
        before_name=before_name, after_name=after_name, basis=basis, unit=unit, basis_note=basis_note,
        tokens_per_step=Figure(tok_b, tok_a), step_s=step, time=time,
        tokens_per_s=Figure(tok_b / sb.step_s if tok_b else None, tok_a / sa.step_s if tok_a else None),
        mfu=mfu, mfu_vs_ceiling=mfu_c, spread=spread, world_size=Figure(ws_b, ws_a), timeline=tl,
        phases=phases,
        outcomes=outcomes(before_analysis.findings, after_analysis.findings, sb, sa, to_before),
        new_findings=new_findings(before_analysis.findings, after_analysis.findings),
        config_changes=settings_changes(before, after),
        notes=notes, not_measured=not_measured, step_change=change)


def world_size(profile: Profile) -> int:
    """Ranks in the run: a merged distributed profile's `ranks` entries (missing ranks included) or
    its run.world_size, whichever is larger; 1 for a single process."""
    ranks = getattr(profile, "ranks", None) or []
    return max(len(ranks), int(profile.run.get("world_size") or 1))


def _mfu(mb: MfuResult | None, ma: MfuResult | None, nb: str, na: str, why: dict) -> tuple[Figure, Figure]:
    """Each analysis's MFU (vs the datasheet peak) and MFU vs the measured ceiling; `why` gets the
    reason for each one a side lacks."""
    vals = {}
    for key in ("mfu", "mfu_vs_ceiling"):
        pair, missing = [], {}
        for m, name in ((mb, nb), (ma, na)):
            v = None if m is None else m.mfu if key == "mfu" else m.mfu_vs_ceiling
            if v is None:
                missing.setdefault(mfu_reason(m, key), []).append(name)
            pair.append(v)
        if missing:
            why[key] = "; ".join(f"{'both profiles' if len(names) == 2 else names[0]}: {r}"
                                 for r, names in missing.items())
        vals[key] = Figure(*pair)
    return vals["mfu"], vals["mfu_vs_ceiling"]


def mfu_reason(m: MfuResult | None, key: str) -> str:
    """Why an analysis's MFU has no `key` (mfu or mfu_vs_ceiling), from what analysis.mfu recorded."""
    if m is None:
        return "not analysed"
    said = key.replace("_", " ") + " not measured: "
    for w in m.warnings:  # the bounds checker's repair of an impossible figure
        if w.startswith(said):
            return w[len(said):]
    if not m.flops_per_step:
        return "FLOPs per step unknown"
    if key == "mfu":
        return "no datasheet peak for the device and dtype" if not m.peak_tflops else "not computed"
    return "no matmul ceiling measured in the step's dtype" if not m.ceiling_tflops else "not computed"


def phase_changes(sb: StepStats, sa: StepStats, scale_b: float = 1.0, scale_a: float = 1.0) -> list[PhaseChange]:
    """Every phase either side measured, in the profile's phase order."""
    names = [p for p in PHASES if p in sb.phases or p in sa.phases] + sorted(
        (set(sb.phases) | set(sa.phases)) - set(PHASES))
    return [PhaseChange(p, Figure(sb.seconds(p) * scale_b, sa.seconds(p) * scale_a), Figure(sb.share(p), sa.share(p)))
            for p in names]


def achieved(finding: Finding, sb: StepStats, sa: StepStats, to_before: float = 1.0) -> tuple:
    """(achieved_s, measured_from, phases, other_phases_change_s), seconds per BEFORE step.

    From the finding's claimed phases when its claims cover its saving, else from the step."""
    claims = {p: float(s) for p, s in (finding.claims or {}).items() if s}
    predicted = finding.saving_s
    names = set(sb.phases) | set(sa.phases)

    def drop(phases) -> float:
        return sum(sb.seconds(p) - sa.seconds(p) * to_before for p in phases)

    others = sorted(names - set(claims))
    other_change = -drop(others) if names else None
    if claims and (predicted is None or sum(claims.values()) >= CLAIMS_COVER * predicted):
        order = [p for p in PHASES if p in claims] + sorted(set(claims) - set(PHASES))
        return drop(order), "phases", order, other_change
    return sb.step_s - sa.step_s * to_before, "step", [], other_change


def verdict(predicted: float | None, ratio: float | None, achieved_s: float | None,
            promised: tuple[float, float] | None = None) -> str:
    """A word for achieved vs predicted: realised (inside the `promised` interval (low, high) when
    the saving has one, else within ±15%), exceeded (above it), partly, not realised, worse (the
    claimed time grew); no prediction (the rule estimated none), none predicted (0 s)."""
    if predicted is None:
        return "no prediction"
    if not predicted:
        return "none predicted"  # a saving capped to 0 by higher-ranked findings
    if ratio is None:
        return NM
    if achieved_s is not None and achieved_s < 0 and (promised is None or achieved_s < promised[0]):
        return "worse"
    if promised is not None and achieved_s is not None and achieved_s >= promised[0] - 1e-9:  # 1 ns: rounding
        return "realised" if achieved_s <= promised[1] + 1e-9 else "exceeded"
    if promised is not None and achieved_s is not None:
        return "partly" if ratio >= NOT_REALISED_BELOW else "not realised"
    if ratio > 1 + REALISED_TOL:
        return "exceeded"
    if ratio >= 1 - REALISED_TOL:
        return "realised"
    if ratio >= NOT_REALISED_BELOW:
        return "partly"
    return "not realised"


def outcomes(before: tuple[Finding, ...], after: tuple[Finding, ...], sb: StepStats, sa: StepStats,
             to_before: float = 1.0) -> list[Outcome]:
    """One Outcome per finding of BEFORE, in BEFORE's ranking."""
    after_by_id = {f.id: f for f in after}
    out = []
    for f in before:
        predicted = f.saving_s
        ach, source, phases, other = achieved(f, sb, sa, to_before)
        if predicted is None:
            ach, source, phases, other = None, None, [], None
        ratio = ach / predicted if predicted and ach is not None else None
        twin = after_by_id.get(f.id)
        ev = f.evidence or {}
        low, high = finite(ev.get("saving_low_s")), finite(ev.get("saving_high_s"))
        iv = (min(low, high), max(low, high)) if low is not None and high is not None else None
        out.append(Outcome(
            id=f.id, title=f.title, kind=f.kind, predicted_s=predicted, achieved_s=ach, ratio=ratio,
            measured_from=source, phases=phases, other_phases_change_s=other,
            verdict=verdict(predicted, ratio, ach, iv), in_after=twin is not None,
            after_saving_s=twin.saving_s if twin is not None else None, overlaps=list(f.overlaps or []),
            judged_by=None if not predicted else "interval" if iv else "tolerance",
            promised_low_s=iv and iv[0], promised_high_s=iv and iv[1], interval_level=finite(ev.get("interval_level")),
            rounds=ev.get("rounds") if isinstance(ev.get("rounds"), int) else None,
            within_noise=ev["within_noise"] if isinstance(ev.get("within_noise"), bool) else None))
    return out


def typical_times(profile: Profile) -> list[float]:
    """The seconds of the steps the typical step is the mean of, on its timeline."""
    st = profile.stats
    return step_times([s for s in profile.steps if int(s.index) in st.typical], st.timeline == "gpu")


def mann_whitney_counts(m: int, n: int) -> np.ndarray:
    """counts[u] / C(m+n, m) = P(U = u), the Mann–Whitney U of m and n steps with no shift: the
    Gaussian binomial [m+n choose m]_q as ∏ (1 − q^(n+i)) / (1 − q^i), i = 1..m; each factor
    reads only lower coefficients, so the low tail (the interval's) is exact to float rounding."""
    m, n = sorted((m, n))
    poly = np.zeros(m * n + 1)
    poly[0] = 1.0
    for i in range(1, m + 1):
        poly[n + i:] = poly[n + i:] - poly[:-(n + i)].copy()
        for r in range(i):
            poly[r::i] = np.cumsum(poly[r::i])
    return poly


def critical_u(m: int, n: int, level: float) -> tuple[int, float]:
    """(k, coverage): [D(k), D(mn+1−k)] of the sorted differences covers the shift with probability
    `coverage` ≥ `level`, k the largest such; k = 0 when even the full range (its coverage) falls short."""
    tail = np.cumsum(mann_whitney_counts(m, n)[: m * n // 2 + 1]) / float(math.comb(m + n, m))
    ok = np.nonzero(2 * tail <= (1 - level) * (1 + 1e-12))[0]
    k = int(ok[-1]) + 1 if ok.size else 0
    return k, 1 - 2 * float(tail[max(k - 1, 0)])


def step_change(before_s: list[float], after_s: list[float], scale: float = 1.0,
                level: float = LEVEL) -> StepChange | None:
    """AFTER ÷ BEFORE (× `scale`, BEFORE's tokens per AFTER's on a per-token basis): the
    Hodges–Lehmann shift of the log step times and its Mann–Whitney interval; None without a
    positive step time on either side."""
    xs = [np.log(np.asarray([t for t in ts if t > 0], dtype=float)) for ts in (before_s, after_s)]
    xs = [x[np.linspace(0, x.size - 1, MAX_STEPS).round().astype(int)] if x.size > MAX_STEPS else x for x in xs]
    b, a = xs
    if not b.size or not a.size:
        return None
    d = np.sort((a[:, None] - b[None, :]).ravel())
    k, coverage = critical_u(b.size, a.size, level)
    est, lo, hi = (float(np.exp(x)) * scale for x in (np.median(d), d[max(k, 1) - 1], d[d.size - max(k, 1)]))
    return StepChange(est, lo, hi, coverage, level, int(b.size), int(a.size))


def new_findings(before: tuple[Finding, ...], after: tuple[Finding, ...]) -> list[dict]:
    """Findings of AFTER whose id BEFORE did not have."""
    seen = {f.id for f in before}
    return [{"id": f.id, "title": f.title, "kind": f.kind, "saving_s": f.saving_s} for f in after if f.id not in seen]
