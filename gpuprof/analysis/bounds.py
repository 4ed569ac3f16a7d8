"""Physical bounds: the one place that says which figures are impossible, and keeps them out.

A tool that exists to catch "MFU over 100%" in others must never print an impossible figure
itself. `violations(profile)` lists every figure of a profile (and its findings) outside its
physical range:
- MFU against the datasheet or against the measured ceiling above 100% (the denominator is
  wrong: a probe that missed this step's fastest path, a wrong peak);
- a measured ceiling above the datasheet peak of the GPU it is matched to (a wrong table row);
- phase shares outside 0-1 or not summing to 1; negative seconds; a step's phases not adding
  up to the step;
- process CPU above cores x 100%, machine CPU above 100% per core, GPU utilisation above 100%;
- a finding's saving negative or above the step, a share outside 0-1, and the fixes' savings
  together above the step.
`enforce(profile)` removes each one the way its meaning requires — an MFU or a ceiling ratio
becomes "not measured" with the reason, a CPU figure from a sample interval too short to mean
anything is dropped, savings are capped by what the higher-ranked fixes left of the step — and
records each repair under summary.bounds. The analysis pipeline calls it last, so the report and
the JSON never carry one; tests call `violations` on every profile they produce, and with
GPUPROF_TEST_STRICT_BOUNDS=1 (set for the whole suite) `enforce` raises instead of repairing a figure a
producer got wrong (CPU rates, phase times): MFU and savings are the analysis's own to repair.
"""

from __future__ import annotations

import math
import os

from gpuprof.units import join_notes, seconds

TOL = 1e-6  # float rounding in sums of shares
CPU_TOL = 1.0 + TOL  # no CPU figure above its cores, not even by rounding


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _step_s(summary: dict) -> float | None:
    return _num(summary.get("mean_step_s")) or _num(summary.get("step_s"))


def violations(profile, findings: list | None = None) -> list[str]:
    """Every impossible figure in the profile (and the given findings, else profile.findings)."""
    out: list[str] = []
    s = profile.summary or {}
    mfu = s.get("mfu") or {}
    for key in ("mfu", "mfu_vs_ceiling"):
        v = _num(mfu.get(key))
        if v is not None and not 0 < v <= 1 + TOL:
            out.append(f"summary.mfu.{key} = {v:.4g} is outside (0, 1]")
    share = _num(mfu.get("ceiling_share_of_peak"))
    if share is not None and share > 1 + TOL:
        out.append(f"summary.mfu.ceiling_share_of_peak = {share:.4g}: a measured ceiling above the datasheet peak")
    phases = s.get("phases") or {}
    if phases:
        total = 0.0
        for name, e in phases.items():
            sh, sec = _num(e.get("share")), _num(e.get("seconds"))
            if sh is None or not -TOL <= sh <= 1 + TOL:
                out.append(f"summary.phases.{name}.share = {e.get('share')!r} is outside 0-1")
            if sec is None or sec < -TOL:
                out.append(f"summary.phases.{name}.seconds = {e.get('seconds')!r} is negative or not a number")
            total += sh or 0.0
        if abs(total - 1) > 1e-3:
            out.append(f"summary.phase shares sum to {total:.4f}, not 1")
    for st in profile.steps:
        if st.wall_s < 0 or any(v < -TOL for v in st.phases.values()):
            out.append(f"step {st.index}: negative time")
        elif st.wall_s and abs(sum(st.phases.values()) - st.wall_s) > 0.02 * st.wall_s + 1e-6:
            out.append(f"step {st.index}: phases add up to {sum(st.phases.values()):.4g} s, the step is {st.wall_s:.4g} s")
    out += _cpu_violations(profile.measurements or {})
    out += _comm_violations("measurements.comm", (profile.measurements or {}).get("comm"))
    out += _distributed_violations((profile.measurements or {}).get("distributed"))
    out += _saving_violations(s, findings if findings is not None else profile.findings)
    for e in getattr(profile, "ranks", None) or []:  # every rank's own profile, as measured
        if isinstance(e, dict) and isinstance(e.get("profile"), dict):
            from gpuprof.profile import Profile

            try:
                rank_profile = Profile.from_dict(e["profile"])
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # malformed, not impossible: profile.validate_ranks refuses it on load
            out += [f"rank {e.get('rank')}: {v}" for v in violations(rank_profile)]
    return out


def _comm_violations(where: str, c) -> list[str]:
    """An all-reduce section: 0 <= exposed <= in flight, per step and overall; bandwidths >= 0."""
    out = []
    if not isinstance(c, dict) or "not_measured" in c:
        return out
    rows = [("", c)] + [(f".per_step[{s.get('index')}]", s) for s in c.get("per_step") or [] if isinstance(s, dict)]
    for sub, r in rows:
        ex, fl = _num(r.get("exposed_s")), _num(r.get("in_flight_s"))
        if ex is not None and ex < -TOL or fl is not None and fl < -TOL:
            out.append(f"{where}{sub}: negative all-reduce time")
        if ex is not None and fl is not None and ex > fl * (1 + 1e-6) + TOL:
            out.append(f"{where}{sub}: exposed {ex:.4g} s is more than the {fl:.4g} s in flight")
    for key in ("busbw_Bps", "algbw_Bps"):
        v = _num(c.get(key))
        if v is not None and v < 0:
            out.append(f"{where}.{key} is negative")
    return out


def _distributed_violations(d) -> list[str]:
    """A merged run's section: busy within 0..step, own phases >= 0, shares in 0-1, waits >= 0,
    bus bandwidth not above the link's nominal figure."""
    out = []
    if not isinstance(d, dict):
        return out
    for r in d.get("ranks") or []:
        busy, step = _num(r.get("busy_s")), _num(r.get("step_s"))
        if busy is not None and (busy < -TOL or (step and busy > step * (1 + 1e-6) + TOL)):
            out.append(f"measurements.distributed rank {r.get('rank')}: busy {busy:.4g} s is outside 0..its step")
        for p, v in (r.get("own_phases") or {}).items():
            if _num(v) is not None and v < -1e-3:  # own backward = backward − exposed: two clocks, ms slack
                out.append(f"measurements.distributed rank {r.get('rank')}: own {p} {v:.4g} s is negative")
    c = d.get("communication") or {}
    for key in ("overlap_share",):
        v = _num(c.get(key))
        if v is not None and not -TOL <= v <= 1 + TOL:
            out.append(f"measurements.distributed.communication.{key} = {v:.4g} is outside 0-1")
    out += _comm_violations("measurements.distributed.communication", c)
    for w in c.get("waiting") or []:
        if _num(w.get("waiting_s")) is not None and w["waiting_s"] < -TOL:
            out.append(f"measurements.distributed: rank {w.get('rank')} waits a negative time")
    bw, nominal = _num(c.get("busbw_Bps")), _num((c.get("link") or {}).get("nominal_Bps"))
    if bw is not None and nominal and bw > nominal * 1.05:
        out.append(f"measurements.distributed: bus bandwidth {bw:.4g} B/s above the link's {nominal:.4g} B/s")
    v = _num((d.get("slowest") or {}).get("extra_share"))
    if v is not None and not -TOL <= v <= 1 + TOL:
        out.append(f"measurements.distributed.slowest.extra_share = {v:.4g} is outside 0-1")
    return out


def _cpu_violations(meas: dict) -> list[str]:
    out = []
    host = meas.get("host") or {}
    cores = _num(host.get("cpu_count"))
    for where, key, limit in _cpu_fields(host, cores):
        out.append(f"measurements.host.{where}.{key} = {limit[1]:.4g}% is above {limit[0]:.0f}%")
    for g in ((meas.get("nvml") or {}).get("gpus") or []):
        for key in ("gpu_util_pct", "mem_util_pct"):
            v = _num(((g.get("summary") or {}).get(key) or {}).get("max"))
            if v is not None and v > 100 + TOL:
                out.append(f"measurements.nvml {key} max {v:.4g}% is above 100%")
    return out


def _cpu_fields(host: dict, cores: float | None):
    """(where, key, (limit, value)) of host CPU figures above their bound."""
    limits = {"cpu_pct": 100.0, "cpu_pct_max_core": 100.0}
    if cores:
        limits["proc_cpu_pct"] = 100.0 * cores
    for key, limit in limits.items():
        stats = (host.get("summary") or {}).get(key) or {}
        for stat in ("mean", "max", "p50", "p90"):
            v = _num(stats.get(stat))
            if v is not None and v > limit * CPU_TOL:
                yield f"summary.{key}", stat, (limit, v)
        for phase, e in (host.get("phases") or {}).items():
            v = _num((e or {}).get(key))
            if v is not None and v > limit * CPU_TOL:
                yield f"phases.{phase}", key, (limit, v)


def _saving_violations(summary: dict, findings) -> list[str]:
    out = []
    step = _step_s(summary)
    total = 0.0
    for f in findings or []:
        d = f if isinstance(f, dict) else f.to_dict()
        sv, sh = _num(d.get("saving_s")), _num(d.get("saving_share"))
        if d.get("saving_s") is not None and sv is None:
            out.append(f"finding {d.get('id')}: saving {d.get('saving_s')!r} is not a number")
        if sv is not None and (sv < -TOL or (step and sv > step * (1 + TOL))):
            out.append(f"finding {d.get('id')}: saving {sv:.4g} s is outside 0.." +
                       (f"the {step:.4g} s step" if step else "the step"))
        if sh is not None and not -TOL <= sh <= 1 + TOL:
            out.append(f"finding {d.get('id')}: saving share {sh:.4g} is outside 0-1")
        if sv and d.get("kind") == "fix":
            total += sv
    if step and total > step * (1 + 1e-6):
        out.append(f"the fixes' savings add up to {total:.4g} s, more than the {step:.4g} s step")
    return out


def enforce(profile, findings: list | None = None) -> list[str]:
    """Repair every violation (see module docstring); returns the repairs (the pipeline records
    them at summary.bounds). Raises AssertionError instead when GPUPROF_TEST_STRICT_BOUNDS=1 and the profile
    needed a repair the analysis should have made itself."""
    repairs: list[str] = []
    s = profile.summary or {}
    mfu = s.get("mfu") or {}
    for key, why in (("mfu", "the datasheet peak is not this step's (a wrong GPU row or dtype)"),
                     ("mfu_vs_ceiling", "the measured ceiling is below what the step achieved: the probe "
                                        "missed this step's fastest path")):
        v = _num(mfu.get(key))
        if v is not None and not 0 < v <= 1 + TOL:
            mfu[key] = None
            mfu.setdefault("warnings", []).append(f"{key.replace('_', ' ')} not measured: {v:.1%} would be "
                                                  f"impossible; {why}")
            repairs.append(f"summary.mfu.{key} {v:.4g} -> not measured")
    share = _num(mfu.get("ceiling_share_of_peak"))
    if share is not None and share > 1 + TOL:
        mfu["ceiling_share_of_peak"] = None
        mfu.setdefault("warnings", []).append(
            f"the measured ceiling is {share:.3g}x the datasheet peak: that peak is not this device's")
        repairs.append("summary.mfu.ceiling_share_of_peak -> not measured")
    repairs += _enforce_cpu(profile.measurements or {})
    found = findings if findings is not None else profile.findings
    repairs += _enforce_savings(s, found)
    left = [v for v in violations(profile, found) if "phase" in v or "step " in v]
    if left:  # shares and step times come from the measurement itself: never invented here
        repairs += [f"unrepaired: {v}" for v in left]
    if repairs:
        if os.environ.get("GPUPROF_TEST_STRICT_BOUNDS") == "1" and any(
                not r.startswith(("summary.mfu.", "finding ")) for r in repairs):
            raise AssertionError("impossible figures in a produced profile: " + "; ".join(repairs))
    return repairs


def _enforce_cpu(meas: dict) -> list[str]:
    host = meas.get("host") or {}
    cores = _num(host.get("cpu_count"))
    repairs = []
    for where, key, (limit, v) in list(_cpu_fields(host, cores)):
        section, _, name = where.partition(".")
        if section == "summary":
            host["summary"][name][key] = None
        else:
            host["phases"][name][key] = None
        repairs.append(f"measurements.host.{where}.{key} {v:.4g}% above {limit:.0f}% -> dropped")
    return repairs


def _enforce_savings(summary: dict, findings) -> list[str]:
    step = _step_s(summary)
    if not step or not findings:
        return []
    repairs, left = [], step
    for f in findings:
        is_dict = isinstance(f, dict)
        get = f.get if is_dict else (lambda k, f=f: getattr(f, k))
        sv = _num(get("saving_s"))
        if sv is None:
            continue
        new = min(max(sv, 0.0), left) if get("kind") == "fix" else min(max(sv, 0.0), step)
        if new < sv - 1e-12 or new > sv + 1e-12:
            why = ("a saving cannot be negative" if sv < 0 else
                   "the fixes ranked above already account for the rest of the step" if new < step else
                   "no saving exceeds the step")
            note = join_notes(get("note") or "", f"saving capped from {seconds(sv)} to {seconds(new)}: {why}")
            claims = get("claims") or {}
            scale = new / sv if sv > 0 else 0.0
            for k, v in (("saving_s", new), ("saving_share", new / step), ("note", note),
                         ("claims", {ph: c * scale for ph, c in claims.items()})):
                if is_dict:
                    f[k] = v
                else:
                    setattr(f, k, v)
            repairs.append(f"finding {get('id')}: saving {sv:.4g} -> {new:.4g} s")
        if get("kind") == "fix":
            left = max(0.0, left - new)
    return repairs
