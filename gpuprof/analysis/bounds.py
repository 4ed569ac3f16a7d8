"""Physical bounds: the one place that says which figures are impossible, and keeps them out.

A tool that exists to catch "MFU over 100%" in others must never print an impossible figure
itself. `violations(profile, analysis)` lists every figure of a profile and of its analysis
outside its physical range:
- MFU against the datasheet or against the measured ceiling above 100% (the denominator is
  wrong: a probe that missed this step's fastest path, a wrong peak);
- a measured ceiling above the datasheet peak of the GPU it is matched to (a wrong table row);
- phase shares outside 0-1 or not summing to 1; negative seconds; a step's phases not adding
  up to the step;
- process CPU above cores x 100%, machine CPU above 100% per core, GPU utilisation above 100%;
- a finding's saving negative or above the step, a share outside 0-1, and the fixes' savings
  together above the step.
`enforce(profile, stats, mfu, findings)` repairs the analysis's own figures the way their meaning
requires — an MFU or a ceiling ratio becomes "not measured" with the reason, savings are capped
by what the higher-ranked fixes left of the step — and returns new figures (a new MfuResult,
dataclasses.replace; new findings) with the list of repairs (Analysis.repairs). It never changes the Profile: measured figures are their producers'
to keep in bounds (the host sampler drops a CPU rate from an interval too short to mean
anything), and one that is not is reported as unrepaired. The test suite checks every profile
and analysis a test makes with this module (tests/strict_bounds.py) and fails the test on any.
"""

from __future__ import annotations

from dataclasses import replace

from gpuprof.analysis.findings import with_share
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.measure.cpu_bounds import cpu_out_of_bounds
from gpuprof.units import finite, join_notes, seconds

TOL = 1e-6  # float rounding in sums of shares


def violations(profile, analysis=None) -> list[str]:
    """Every impossible figure in the profile and, when given, its analysis."""
    out = measured_violations(profile)
    if analysis is not None:
        out += analysis_violations(analysis.stats, analysis.mfu, analysis.findings)
        out += _distributed_violations(analysis.distributed)
    return out


def analysis_violations(stats, mfu: MfuResult | None, findings) -> list[str]:
    """The analysis's own figures out of bounds: MFU, the ceiling's share of the peak, savings."""
    out: list[str] = []
    if mfu is not None:
        for key, value in (("mfu", mfu.mfu), ("mfu_vs_ceiling", mfu.mfu_vs_ceiling)):
            v = finite(value)
            if v is not None and not 0 < v <= 1 + TOL:
                out.append(f"mfu.{key} = {v:.4g} is outside (0, 1]")
        share = finite(mfu.ceiling_share_of_peak)
        if share is not None and share > 1 + TOL:
            out.append(f"mfu.ceiling_share_of_peak = {share:.4g}: a measured ceiling above the datasheet peak")
    out += _saving_violations(stats, findings)
    return out


def measured_violations(profile) -> list[str]:
    """The profile's measured figures out of bounds (its producers' to keep in bounds)."""
    out: list[str] = []
    stats = profile.stats
    if stats is not None and stats.phases:
        total = 0.0
        for name, e in stats.phases.items():
            sh, sec = finite(e.share), finite(e.seconds)
            if sh is None or not -TOL <= sh <= 1 + TOL:
                out.append(f"phases.{name}.share = {e.share!r} is outside 0-1")
            if sec is None or sec < -TOL:
                out.append(f"phases.{name}.seconds = {e.seconds!r} is negative or not a number")
            total += sh or 0.0
        if stats.step_s and abs(total - 1) > 1e-3:
            out.append(f"phase shares sum to {total:.4f}, not 1")
    for st in profile.steps:
        if st.wall_s < 0 or any(v < -TOL for v in st.phases.values()):
            out.append(f"step {st.index}: negative time")
        elif st.wall_s and abs(sum(st.phases.values()) - st.wall_s) > 0.02 * st.wall_s + 1e-6:
            out.append(f"step {st.index}: phases add up to {sum(st.phases.values()):.4g} s, the step is {st.wall_s:.4g} s")
    out += _cpu_violations(profile.sections)
    out += _comm_violations("measurements.comm", profile.sections.comm.raw)
    for e in getattr(profile, "ranks", None) or []:  # every rank's own profile, as measured
        if isinstance(e, dict) and isinstance(e.get("profile"), dict):
            from gpuprof.profile import Profile

            try:
                rank_profile = Profile.from_dict(e["profile"])
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # malformed, not impossible: profile.validate_ranks refuses it on load
            out += [f"rank {e.get('rank')}: {v}" for v in measured_violations(rank_profile)]
    return out


def _comm_violations(where: str, c) -> list[str]:
    """An all-reduce section: 0 <= exposed <= in flight, per step and overall; bandwidths >= 0."""
    out = []
    if not isinstance(c, dict) or "not_measured" in c:
        return out
    rows = [("", c)] + [(f".per_step[{s.get('index')}]", s) for s in c.get("per_step") or [] if isinstance(s, dict)]
    for sub, r in rows:
        ex, fl = finite(r.get("exposed_s")), finite(r.get("in_flight_s"))
        if ex is not None and ex < -TOL or fl is not None and fl < -TOL:
            out.append(f"{where}{sub}: negative all-reduce time")
        if ex is not None and fl is not None and ex > fl * (1 + 1e-6) + TOL:
            out.append(f"{where}{sub}: exposed {ex:.4g} s is more than the {fl:.4g} s in flight")
    for key in ("busbw_Bps", "algbw_Bps"):
        v = finite(c.get(key))
        if v is not None and v < 0:
            out.append(f"{where}.{key} is negative")
    return out


def _distributed_violations(d) -> list[str]:
    """A merged run's section (DistributedStats, or its saved dict): busy within 0..step, own
    phases >= 0, shares in 0-1, waits >= 0, bus bandwidth not above the link's nominal figure,
    FSDP's collectives within the step."""
    out = []
    if hasattr(d, "to_dict"):
        d = d.to_dict()
    if not isinstance(d, dict):
        return out
    for r in d.get("ranks") or []:
        busy, step = finite(r.get("busy_s")), finite(r.get("step_s"))
        if busy is not None and (busy < -TOL or (step and busy > step * (1 + 1e-6) + TOL)):
            out.append(f"distributed rank {r.get('rank')}: busy {busy:.4g} s is outside 0..its step")
        for p, v in (r.get("own_phases") or {}).items():
            if finite(v) is not None and v < -1e-3:  # own backward = backward − exposed: two clocks, ms slack
                out.append(f"distributed rank {r.get('rank')}: own {p} {v:.4g} s is negative")
    c = d.get("communication") or {}
    for key in ("overlap_share",):
        v = finite(c.get(key))
        if v is not None and not -TOL <= v <= 1 + TOL:
            out.append(f"distributed.communication.{key} = {v:.4g} is outside 0-1")
    out += _comm_violations("distributed.communication", c)
    for w in c.get("waiting") or []:
        if finite(w.get("waiting_s")) is not None and w["waiting_s"] < -TOL:
            out.append(f"distributed: rank {w.get('rank')} waits a negative time")
    bw, nominal = finite(c.get("busbw_Bps")), finite((c.get("link") or {}).get("nominal_Bps"))
    if bw is not None and nominal and bw > nominal * 1.05:
        out.append(f"distributed: bus bandwidth {bw:.4g} B/s above the link's {nominal:.4g} B/s")
    v = finite((d.get("slowest") or {}).get("extra_share"))
    if v is not None and not -TOL <= v <= 1 + TOL:
        out.append(f"distributed.slowest.extra_share = {v:.4g} is outside 0-1")
    k = d.get("collectives") or {}
    ex, step = finite(k.get("exposed_s")), finite(k.get("step_s"))
    if ex is not None and (ex < -TOL or (step and ex > step * (1 + 1e-6) + TOL)):
        out.append(f"distributed.collectives: exposed {ex:.4g} s is outside 0..the step")
    for w in k.get("waiting") or []:
        if finite(w.get("waiting_s")) is not None and w["waiting_s"] < -TOL:
            out.append(f"distributed.collectives: rank {w.get('rank')} waits a negative time")
    return out


def _cpu_violations(sections) -> list[str]:
    out = []
    host = sections.host
    # The sampler's own check of its CPU figures, over the section as it stored it.
    for where, key, limit in cpu_out_of_bounds(host.raw, finite(host.cpu_count)):
        out.append(f"measurements.host.{where}.{key} = {limit[1]:.4g}% is above {limit[0]:.0f}%")
    for g in sections.nvml.gpus:
        for key in ("gpu_util_pct", "mem_util_pct"):
            v = finite(g.stat(key).max)
            if v is not None and v > 100 + TOL:
                out.append(f"measurements.nvml {key} max {v:.4g}% is above 100%")
    return out


def _saving_violations(stats, findings) -> list[str]:
    out = []
    step = finite(stats.step_s) if stats is not None else None
    total = 0.0
    for f in findings or []:
        sv, sh = finite(f.saving_s), finite(f.saving_share)
        if f.saving_s is not None and sv is None:
            out.append(f"finding {f.id}: saving {f.saving_s!r} is not a number")
        if sv is not None and (sv < -TOL or (step and sv > step * (1 + TOL))):
            out.append(f"finding {f.id}: saving {sv:.4g} s is outside 0.." +
                       (f"the {step:.4g} s step" if step else "the step"))
        if sh is not None and not -TOL <= sh <= 1 + TOL:
            out.append(f"finding {f.id}: saving share {sh:.4g} is outside 0-1")
        if sv and f.kind == "fix":
            total += sv
    if step and total > step * (1 + 1e-6):
        out.append(f"the fixes' savings add up to {total:.4g} s, more than the {step:.4g} s step")
    return out


def enforce(profile, stats, mfu: MfuResult | None, findings: list) -> tuple[MfuResult | None, list, list[str]]:
    """The analysis's figures with every violation repaired (module docstring): (mfu, findings,
    repairs), new objects; the profile and the given ones are not changed. A measured figure out
    of bounds is listed as unrepaired. The pipeline calls its two halves at their own times."""
    mfu, repairs = enforce_measured(profile, mfu)
    findings, saving_repairs = enforce_savings(stats, findings)
    return mfu, findings, repairs + saving_repairs


def enforce_measured(profile, mfu: MfuResult | None) -> tuple[MfuResult | None, list[str]]:
    """Before the rules: the MFU repaired (so the rules read only possible figures), and the
    measured figures out of bounds listed as unrepaired (they are their producers' to keep in
    bounds: never changed here)."""
    repairs: list[str] = []
    if mfu is not None:
        mfu, repairs = _enforce_mfu(mfu)
    return mfu, repairs + [f"unrepaired: {v}" for v in measured_violations(profile)]


def enforce_savings(stats, findings: list) -> tuple[list, list[str]]:
    """After the rules: the savings capped to what the step holds (module docstring)."""
    return _enforce_savings(stats, findings)


def _enforce_mfu(mfu: MfuResult) -> tuple[MfuResult, list[str]]:
    """An MFU or a ceiling ratio outside its range becomes "not measured", with the reason among
    the result's warnings: a new MfuResult."""
    repairs: list[str] = []
    changes: dict = {}
    warnings = list(mfu.warnings)
    for key, value, why in (("mfu", mfu.mfu, "the datasheet peak is not this step's (a wrong GPU row or dtype)"),
                            ("mfu_vs_ceiling", mfu.mfu_vs_ceiling, "the measured ceiling is below what the step "
                                                                   "achieved: the probe missed this step's fastest path")):
        v = finite(value)
        if v is not None and not 0 < v <= 1 + TOL:
            changes[key] = None
            warnings.append(f"{key.replace('_', ' ')} not measured: {v:.1%} would be impossible; {why}")
            repairs.append(f"mfu.{key} {v:.4g} -> not measured")
    share = finite(mfu.ceiling_share_of_peak)
    if share is not None and share > 1 + TOL:
        changes["ceiling_share_of_peak"] = None
        warnings.append(f"the measured ceiling is {share:.3g}x the datasheet peak: that peak is not this device's")
        repairs.append("mfu.ceiling_share_of_peak -> not measured")
    if not changes:
        return mfu, repairs
    return replace(mfu, **changes, warnings=tuple(warnings)), repairs


def _enforce_savings(stats, findings) -> tuple[list, list[str]]:
    step = finite(stats.step_s) if stats is not None else None
    if not step or not findings:
        return list(findings or []), []
    repairs, left, out = [], step, []
    for f in findings:
        sv = finite(f.saving_s)
        if sv is not None:
            new = min(max(sv, 0.0), left) if f.kind == "fix" else min(max(sv, 0.0), step)
            if new < sv - 1e-12 or new > sv + 1e-12:
                why = ("a saving cannot be negative" if sv < 0 else
                       "the fixes ranked above already account for the rest of the step" if new < step else
                       "no saving exceeds the step")
                scale = new / sv if sv > 0 else 0.0
                f = with_share(replace(f, saving_s=new, note=join_notes(
                    f.note or "", f"saving capped from {seconds(sv)} to {seconds(new)}: {why}"),
                    claims={ph: c * scale for ph, c in (f.claims or {}).items()}), step)
                repairs.append(f"finding {f.id}: saving {sv:.4g} -> {new:.4g} s")
            if f.kind == "fix":
                left = max(0.0, left - new)
        out.append(f)
    return out, repairs
