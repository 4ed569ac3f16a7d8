"""Runs the rules over a profile and ranks their findings.

A rule is a plain function `rule(ctx: Context) -> list[Finding]`; rules never run anything and
never print. Findings are ranked by the seconds they expect to save per step; findings that
cannot estimate a saving come after those that can, and informational ones last. Where two
fixes' savings both carry an interval (timed in paired rounds) and the intervals overlap, both
are marked `tied_with` each other: the order between them is not measured.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from gpuprof.analysis.findings import Context, Finding, Rule, with_share  # noqa: F401 - re-exported
from gpuprof.analysis.rules import RULES
from gpuprof.measure.paired import tied
from gpuprof.units import join_notes, seconds

# The order kinds are listed in: fixes by saving, then corrections of wrong figures, verdicts,
# what irregular steps cost, information.
KIND_ORDER = {"fix": 0, "correction": 1, "verdict": 2, "irregular": 3, "info": 4}


def _key(f: Finding):
    """Fixes by their saving; those without one by the ceiling they state (evidence `ceiling_s`: the
    most their phases could give, measured), never by their name alone; the id only breaks ties."""
    worth = f.saving_s if f.saving_s is not None else (f.evidence or {}).get("ceiling_s") or 0.0
    return (KIND_ORDER.get(f.kind, len(KIND_ORDER)), f.saving_s is None, -worth, f.id)


SPECIFIC_FIRST = ("straggler-rank",)  # fixes that name where (which rank) the time of a phase goes
SPECIFIC_MARGIN = 0.05  # of the step: the least by which another fix must save more to stay ahead


def _specific_first(ordered: list[Finding], step_s: float | None) -> list[Finding]:
    """A straggler's fix names the rank and the phase whose extra time a single-rank fix on the
    merged view (the slowest rank's) claims too: the same seconds, told twice. Where that other
    fix saves no more than the straggler's own saving plus its margin (3x the per-step difference's
    variation, at least SPECIFIC_MARGIN of the step), the straggler's goes first, and the other
    keeps what is left of the phase; one that saves clearly more (every rank's data slow, not one
    rank's) stays ahead. Without this the two swapped on noise (1 run in 5 of the same script)."""
    out = list(ordered)
    for f in [f for f in ordered if f.id in SPECIFIC_FIRST and f.saving_s and f.claims]:
        noise = (f.evidence or {}).get("noise_s") or 0.0
        margin = max(3.0 * noise, SPECIFIC_MARGIN * (step_s or 0.0))
        at = out.index(f)
        ahead = [i for i, g in enumerate(out[:at]) if g.kind == f.kind and g.saving_s is not None
                 and set(g.claims) & set(f.claims) and g.saving_s <= f.saving_s + margin]
        if ahead and all(out[i].saving_s <= f.saving_s + margin for i in range(ahead[0], at)
                         if out[i].saving_s is not None):
            out.insert(ahead[0], out.pop(at))
    return out


def rank(findings: list[Finding], stats=None) -> list[Finding]:
    """Sort fixes by saving (largest first), then fixes that cannot estimate, corrections of
    wrong figures, verdicts, information.

    Savings that claim the same phase interval are capped: a lower-ranked finding keeps only
    what the higher-ranked ones left of that interval, so savings never add up to more than
    the step. Returns new Findings; the given ones are not changed."""
    step_s = stats.step_s if stats is not None else None
    budget = {p: e.seconds for p, e in (stats.phases if stats is not None else {}).items()}
    whole = dict(budget)
    owners: dict[str, list[str]] = {}
    out = []
    for f in _specific_first(sorted(findings, key=_key), step_s):
        if f.saving_s is None or not f.claims:
            out.append(f)
            continue
        capped, overlaps = 0.0, list(f.overlaps)
        f = _untimed_left(f, budget, owners, whole)
        for phase, sec in f.claims.items():
            left = budget.setdefault(phase, sec)
            if phase in owners:
                overlaps.extend(o for o in owners[phase] if o not in overlaps)
            take = min(sec, max(left, 0.0))
            budget[phase] = left - take
            owners.setdefault(phase, []).append(f.id)
            capped += take
        # Savings that are not pinned to a phase (e.g. faster kernels) stay as estimated.
        unpinned = max(f.saving_s - sum(f.claims.values()), 0.0)
        new = capped + unpinned
        if new < f.saving_s - 1e-12:
            why = (f"it shares time with {', '.join(overlaps)}" if overlaps
                   else "the phases it comes out of take less than that per step")
            f = with_share(replace(f, note=join_notes(f.note, f"saving capped from {seconds(f.saving_s)}: {why}"),
                                   saving_s=new, overlaps=overlaps, evidence=_capped_interval(f.evidence, new)),
                           step_s)
        elif overlaps != f.overlaps:
            f = replace(f, overlaps=overlaps)
        out.append(f)
    return mark_ties(sorted(out, key=_key))


def _untimed_left(f: Finding, budget: dict, owners: dict, whole: dict) -> Finding:
    """A high end that holds untimed seconds of phases it does not claim (evidence
    `untimed_loop_phases`, e.g. the loop code fewer micro-steps run less often) keeps of each the
    share the higher-ranked fixes left of that phase (untimed × left ÷ the phase): a phase another
    fix already saves cannot be saved twice."""
    ev = f.evidence or {}
    untimed = ev.get("untimed_loop_phases")
    if not isinstance(untimed, dict) or "saving_high_s" not in ev:
        return f
    over = {}
    for p, s in untimed.items():
        if p in owners and whole.get(p):
            kept = s * min(max(budget.get(p, 0.0), 0.0) / whole[p], 1.0)
            if s - kept > 1e-12:
                over[p] = s - kept
    if not over:
        return f
    cut = sum(over.values())
    high = max(ev["saving_high_s"] - cut, f.saving_s if f.saving_s is not None else ev["saving_low_s"])
    who = sorted({o for p in over for o in owners[p]})
    return replace(f, evidence={**ev, "saving_high_s": high, "untimed_loop_s": ev.get("untimed_loop_s", 0.0) - cut,
                                "untimed_claimed_by": who},
                   note=join_notes(f.note, f"{seconds(cut)} of that untimed loop code is already saved by "
                                           f"{', '.join(who)}: not counted again"))


def _capped_interval(evidence: dict, cap: float) -> dict:
    """A capped saving's interval, capped too (no end above what is left of its phases)."""
    if "saving_low_s" not in evidence:
        return evidence
    return {**evidence, "saving_low_s": min(evidence["saving_low_s"], cap),
            "saving_high_s": min(evidence["saving_high_s"], cap)}


def _interval(f: Finding):
    ev = f.evidence or {}
    if f.kind != "fix" or f.saving_s is None or "saving_low_s" not in ev:
        return None
    return SimpleNamespace(low=ev["saving_low_s"], high=ev["saving_high_s"])


def mark_ties(ranked: list[Finding]) -> list[Finding]:
    """Every two fixes whose savings' intervals overlap (paired.tied): each marked `tied_with` the
    other, in rank order, so no order between them is printed as if measured. A saving without an
    interval is never tied."""
    ranked = [replace(f, tied_with=[]) if f.tied_with else f for f in ranked]  # ranked again: anew
    fixes = [(i, iv) for i, f in enumerate(ranked) if (iv := _interval(f)) is not None]
    ties: dict[int, list[str]] = {}
    for a, (i, iv_i) in enumerate(fixes):
        for j, iv_j in fixes[a + 1:]:
            if tied(iv_i, iv_j):
                ties.setdefault(i, []).append(ranked[j].id)
                ties.setdefault(j, []).append(ranked[i].id)
    return [replace(f, tied_with=ties[i]) if i in ties else f for i, f in enumerate(ranked)]




def run_rules(ctx: Context, rules: list[Rule] | None = None) -> list[Finding]:
    """Run every rule (default: all registered) and return the ranked findings, each with its
    saving as a share of the typical step."""
    if rules is None:
        rules = RULES
    if ctx.stats is None:
        return []
    out: list[Finding] = []
    for rule in rules:
        out.extend(with_share(f, ctx.stats.step_s) for f in rule(ctx))
    return rank(out, ctx.stats)
