"""What the ranks of a data-parallel `gpuprof watch` say together, after the run: each rank's
watch section (its windows, changes and periodic events, from its own recorder), and a rank that
fell behind, named on the changes it caused. Pure: the merged profile in, sections out.

In data parallel every rank waits for the slowest at each gradient all-reduce, so when one rank's
data or compute grows, every rank's step grows with it: the rank that fell behind shows the
change in its own phase (data, forward, ...), the others in the phase where they wait (`comm`,
the all-reduce, or the backward that holds it). A change of a rank is given a `straggler` cause
when another rank changed at a step within STRAGGLER_STEPS of it, in the same direction, in a
phase that is not a waiting one: that rank's figures are the evidence. Each rank sees only itself
while it runs, so this is named in the final report, not live in the events files.
"""

from __future__ import annotations

WAITING_PHASES = ("comm", "backward")  # where a rank waits for a slower one (DDP's all-reduce runs inside backward)
STRAGGLER_STEPS = 2


def rank_sections(profile) -> list[tuple[int, dict]]:
    """(rank, its measurements.watch) for every rank that has one, in rank order, with the
    straggler causes added to its changes."""
    out = []
    for e in sorted(profile.ranks or [], key=lambda e: e.get("rank", 0)):
        section = ((e.get("profile") or {}).get("measurements") or {}).get("watch")
        if section:
            out.append((int(e["rank"]), section))
    add_straggler_causes(out)
    return out


def add_straggler_causes(sections: list[tuple[int, dict]]) -> None:
    for rank, section in sections:
        for c in section.get("changes") or []:
            for other, osec in sections:
                if other == rank:
                    continue
                for oc in osec.get("changes") or []:
                    if oc.get("direction") != c.get("direction") or oc.get("phase") in WAITING_PHASES:
                        continue
                    if abs(int(oc["at_step"]) - int(c["at_step"])) > STRAGGLER_STEPS:
                        continue
                    if c.get("phase") in WAITING_PHASES:
                        evidence = {"rank": other, "phase": oc["phase"], "at_step": oc["at_step"],
                                    "phase_before_s": oc.get("phase_before_s"), "phase_after_s": oc.get("phase_after_s")}
                        cause = {"kind": "straggler", "evidence": evidence}
                        if cause not in (c.get("causes") or []):
                            c.setdefault("causes", []).insert(0, cause)
            if c.get("phase") not in WAITING_PHASES:
                waited = [o for o, osec in sections if o != rank and any(
                    oc.get("phase") in WAITING_PHASES and oc.get("direction") == c.get("direction")
                    and abs(int(oc["at_step"]) - int(c["at_step"])) <= STRAGGLER_STEPS
                    for oc in osec.get("changes") or [])]
                if waited:
                    cause = {"kind": "straggler", "evidence": {"rank": rank, "self": True, "waited": waited}}
                    if cause not in (c.get("causes") or []):
                        c.setdefault("causes", []).insert(0, cause)
