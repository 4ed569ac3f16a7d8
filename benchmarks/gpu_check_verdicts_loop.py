"""gpu_check's verdict on a promise measured on the built-in loop's own steps (issue #41): the saving
a fix's experiment steps promised (its finding's interval, seconds per step) against what the
corrected config achieves when run: BEFORE's typical step − AFTER's, both on the GPU timeline.
Pure: it reads two profile dicts."""

from __future__ import annotations

from gpu_check_profile import Missing, findings, lookup

# The bar for an advice chain on a GPU: it delivers what it promised within ±15% (#42).
TOLERANCE = 0.15


def judge_loop_promise(before: dict, after: dict, finding_id: str, exp_id: str) -> tuple[bool, str, dict]:
    """(ok, why, figures): `finding_id`'s saving in BEFORE, measured on the loop by experiment
    `exp_id`, holds what AFTER (BEFORE with the fix applied) achieved: low × 0.85 ≤ achieved ≤ high × 1.15."""
    results = lookup(before, "measurements.experiments.results")
    exp = next((r for r in results if r.get("id") == exp_id), None) if isinstance(results, list) else None
    steps = (lookup(before, "analysis.steps.step_s"), lookup(after, "analysis.steps.step_s"))
    fig = {"experiment": exp_id, "pairs": exp.get("pairs") if exp else None,
           "ratio": exp.get("ratio") if exp else None, "before_step_s": steps[0], "after_step_s": steps[1]}
    if exp is None or exp.get("interval") is None:
        why = results if isinstance(results, Missing) else (exp or {}).get("not_measured", "no such experiment")
        return False, f"{exp_id} was not measured on the loop: {why}", fig
    f = next((x for x in findings(before) if x.get("id") == finding_id), None)
    ev = (f or {}).get("evidence") or {}
    low, high = ev.get("saving_low_s"), ev.get("saving_high_s")
    if f is None or not f.get("saving_s") or low is None or high is None:
        return False, f"{finding_id} promised no saving ({(f or {}).get('note') or 'no such finding'})", fig
    if any(isinstance(s, Missing) for s in steps):
        return False, f"a typical step is missing: {next(s for s in steps if isinstance(s, Missing))}", fig
    achieved = steps[0] - steps[1]
    fig.update(promised_s=f["saving_s"], promised_low_s=low, promised_high_s=high, achieved_s=achieved)
    ok = low * (1 - TOLERANCE) <= achieved <= high * (1 + TOLERANCE)
    return ok, (f"{finding_id}: promised {low * 1e3:.1f}–{high * 1e3:.1f} ms per step (measured on the loop, "
                f"{exp.get('pairs')} pairs), achieved {achieved * 1e3:.1f} ms ({steps[0] * 1e3:.1f} → "
                f"{steps[1] * 1e3:.1f} ms){'' if ok else f': outside the promise ±{TOLERANCE:.0%}'}"), fig
