"""Joining the per-rank profiles of a data-parallel run into one.

Each rank measures itself and writes its own profile (gpuprof.runners.rank); this module only
reads them, so a node's merge (done by gpuprof's launcher on that node) and an offline merge of
several nodes' files (`gpuprof merge`) are the same function of the same set of rank entries:
merging node files equals merging all their ranks at once.

A merged profile keeps every rank's whole profile under `ranks` and shows, at the top level, the
slowest rank's steps and measurements (one process's view, as for a single GPU: the job runs at
that rank's pace, and its phases hold its own work rather than waiting for another rank; the
lowest present rank when the ranks' all-reduces were not measured), plus
`measurements.distributed`: per rank the step, phases, data time and all-reduce figures, the
slowest rank, and the job's communication figures.

Comparing ranks separates communication from waiting. In synchronous data parallelism every rank
ends its backward when the slowest rank's gradients arrive, so all step times are alike and a
fast rank's extra time hides in its all-reduce ("exposed": after its own backward compute). A
rank's busy time = its step − its exposed all-reduce time; the slowest rank is the busiest, by
how much it exceeds the median of the others, in the phase that grew most. The rank that waited
least for its all-reduce shows what communication itself costs (the others' extra exposure is
waiting for it).
"""

from __future__ import annotations

import copy
import statistics

from gpuprof.errors import GpuprofError
from gpuprof.profile import PHASES, Profile

STATUSES = ("ok", "failed", "interrupted", "missing")


def entries_of(profile: Profile) -> list[dict]:
    """The rank entries a profile holds: its `ranks`, or itself as one rank."""
    if profile.ranks:
        return [dict(e) for e in profile.ranks]
    run = profile.run
    ended = run.get("ended", "finished")
    status = {"failed": "failed", "interrupted": "interrupted"}.get(ended, "ok")
    d = profile.to_dict()
    d["findings"] = []
    return [{"rank": int(run.get("rank", 0)), "local_rank": int(run.get("local_rank", 0) or 0),
             "node_rank": int(run.get("node_rank", 0) or 0), "host": run.get("host"),
             "world_size": int(run.get("world_size", 1)), "status": status, "error": run.get("error"),
             "profile": d}]


def merge_profiles(named: list[tuple[str, Profile]]) -> Profile:
    """`gpuprof merge A.json B.json ...`: every rank of every file, once."""
    seen: dict[int, tuple[str, dict]] = {}
    for name, prof in named:
        for e in entries_of(prof):
            r = e["rank"]
            if r in seen:
                other, prev = seen[r]
                if prev.get("profile") is None and e.get("profile") is not None:
                    seen[r] = (name, e)  # a node's "missing" placeholder, filled by the rank's own file
                    continue
                if e.get("profile") is None:
                    continue
                raise GpuprofError(f"rank {r} is in both {other} and {name}: merge each rank once "
                                   f"(the files of one run's nodes)")
            seen[r] = (name, e)
    worlds = {e.get("world_size") for _, e in seen.values() if e.get("world_size")}
    if len(worlds) > 1:
        raise GpuprofError(f"the files come from runs of different world sizes ({sorted(worlds)}): "
                           f"merge the nodes of one run")
    return merge_entries([e for _, e in seen.values()])


def merge_entries(entries: list[dict]) -> Profile:
    """One profile from rank entries (see Profile.ranks). GpuprofError when no rank has a profile."""
    entries = sorted(entries, key=lambda e: e["rank"])
    present = [e for e in entries if e.get("profile") is not None]
    if not present:
        lines = "; ".join(f"rank {e['rank']}: {_error_text(e)}" for e in entries) or "no rank entries"
        raise GpuprofError(f"no rank completed a training step ({lines})")
    world = max(int(e.get("world_size") or 1) for e in entries)
    dist = distributed_summary(entries, world)
    # The view: the slowest rank, whose pace the whole synchronous step follows (its phases hold
    # its own work, not waiting for another rank); the lowest present rank when none is measured.
    slow = (dist.get("slowest") or {}).get("rank")
    chosen = next((e for e in present if e["rank"] == slow), present[0])
    base = Profile.from_dict(copy.deepcopy(chosen["profile"]))  # analysis writes into its summary
    base.findings = []
    nodes: dict[int, int] = {}
    for e in entries:
        if e.get("node_rank") is not None:  # a rank that died without a file may not know its node
            nodes[e["node_rank"]] = nodes.get(e["node_rank"], 0) + 1
    base.run = dict(base.run)
    base.run["world_size"] = world
    base.run["view"] = (f"rank {chosen['rank']} ("
                        + ("the slowest rank" if chosen["rank"] == slow else "the lowest rank with a profile")
                        + "); every rank under `ranks`")
    base.run["launch"] = {"nnodes": max(1, len(nodes)), "nproc_per_node": max([*nodes.values(), 1]),
                          "world_size": world}
    base.summary.pop("mfu", None)
    base.summary.pop("bounds", None)
    base.summary.pop("corrected_config", None)
    base.measurements = dict(base.measurements)
    base.measurements["distributed"] = dist
    base.ranks = [{**e, "profile": _strip(e.get("profile"))} for e in entries]
    return base


def _strip(prof: dict | None) -> dict | None:
    """A rank's profile as measured: the analysis of a previous merge is recomputed, not kept."""
    if prof is None:
        return None
    d = copy.deepcopy(prof)
    d["findings"] = []
    d.pop("ranks", None)
    return d


def one_line(message) -> str:
    """An error message as one line: its first non-empty line (gloo and NCCL errors append
    blank lines and a Python stack)."""
    lines = [ln.strip() for ln in str(message or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _error_text(e: dict) -> str:
    err = e.get("error") or {}
    if not err:
        return e.get("status", "no profile")
    where = f" at {err['file']}:{err['line']}" if err.get("file") else ""
    return f"{err.get('type', 'error')}{where}: {one_line(err.get('message'))}".strip()


def _comm(prof: dict) -> dict | None:
    """A rank's all-reduce figures: medians over its measured steps, as CommMeter stores them."""
    c = (prof.get("measurements") or {}).get("comm")
    if not c or "not_measured" in c or not c.get("per_step"):
        return None
    per = c["per_step"]
    return {"in_flight_s": _median([s.get("in_flight_s") for s in per]),
            "exposed_s": _median([s.get("exposed_s") for s in per]),
            "extra_rounds_exposed_s": _median([s.get("extra_rounds_exposed_s") for s in per]),
            "extra_rounds_in_flight_s": _median([s.get("extra_rounds_in_flight_s") for s in per]),
            "rounds_per_step": statistics.median([s["rounds"] for s in per]),
            "bytes_per_round": c.get("bytes_per_round"), "busbw_Bps": c.get("busbw_Bps"),
            "algbw_Bps": c.get("algbw_Bps"), "backend": c.get("backend"), "clock": c.get("clock"),
            "link": c.get("link")}


def _rank_row(e: dict) -> dict:
    row = {"rank": e["rank"], "node_rank": e.get("node_rank"), "host": e.get("host"),
           "status": e.get("status"), "error": _error_text(e) if e.get("status") != "ok" else None}
    prof = e.get("profile")
    if prof is None:
        return row
    s = prof.get("summary") or {}
    phases = {p: v.get("seconds", 0.0) for p, v in (s.get("phases") or {}).items()}
    comm = _comm(prof)
    step = s.get("step_s")  # the median step: the figure the report prints for a step
    row["ended_in"] = (prof.get("run") or {}).get("ended_in")
    row.update(step_s=step, mean_step_s=s.get("mean_step_s"), phases=phases, data_s=phases.get("data", 0.0),
               micro_steps=s.get("micro_steps"), tokens_per_step=s.get("tokens_per_step"),
               n_steps=s.get("n_steps"), comm=comm,
               comm_not_measured=((prof.get("measurements") or {}).get("comm") or {}).get("not_measured"))
    if comm is not None and step:
        row.update(_busy(prof, s.get("timeline")))
    return row


def _busy(prof: dict, timeline: str | None) -> dict:
    """Per measured step: busy = step − that step's exposed all-reduce, and each phase with the
    backward's exposed all-reduce taken out (the rank's own compute). The row shows medians over
    the steps; the per-step figures (`_steps`, not kept in the profile) pair the ranks step by
    step for the straggler."""
    exposed = {s["index"]: s["exposed_s"] for s in prof["measurements"]["comm"]["per_step"]}
    gpu = timeline == "gpu"
    per: dict[int, dict] = {}
    for st in prof.get("steps") or []:
        if st["index"] not in exposed:
            continue
        phases = (st.get("gpu_phases") if gpu else st.get("phases")) or {}
        total = (st.get("gpu_s") if gpu else st.get("wall_s")) or sum(phases.values())
        e = min(exposed[st["index"]], total)
        per[st["index"]] = {"busy": total - e,
                            "own": {p: phases[p] - (e if p == "backward" else 0.0) for p in PHASES if p in phases}}
    if not per:
        return {}
    own_keys = {p for v in per.values() for p in v["own"]}
    return {"busy_s": statistics.median(v["busy"] for v in per.values()),
            "own_phases": {p: statistics.median(v["own"].get(p, 0.0) for v in per.values()) for p in PHASES
                           if p in own_keys},
            "_steps": per}


def distributed_summary(entries: list[dict], world: int) -> dict:
    rows = [_rank_row(e) for e in sorted(entries, key=lambda e: e["rank"])]
    present = {r["rank"] for r in rows}
    out = {
        "world_size": world,
        "ranks": rows,
        "absent_ranks": [r for r in range(world) if r not in present],
        "failed_ranks": [r["rank"] for r in rows if r["status"] != "ok"],
        "method": ("busy = step − exposed all-reduce (time after the rank's own backward compute "
                   "spent waiting for the all-reduce); the slowest rank is the busiest"),
    }
    measured = [r for r in rows if r.get("busy_s") is not None and r["status"] == "ok"]
    if len(measured) >= 2:
        slowest = _slowest(measured)
        if slowest:
            out["slowest"] = slowest
    for r in rows:
        r.pop("_steps", None)  # per-step pairs: the straggler's input, not kept in the profile
    comm_rows = [r for r in rows if r.get("comm")]
    if comm_rows:
        least = min(comm_rows, key=lambda r: r["comm"]["exposed_s"] or 0.0)
        c = least["comm"]
        out["communication"] = {
            "rank": least["rank"],
            "in_flight_s": c["in_flight_s"],
            "exposed_s": c["exposed_s"],
            "overlapped_s": max(0.0, (c["in_flight_s"] or 0.0) - (c["exposed_s"] or 0.0)),
            "overlap_share": (1 - c["exposed_s"] / c["in_flight_s"]) if c["in_flight_s"] else None,
            "step_s": least["step_s"],
            "rounds_per_step": statistics.median([r["comm"]["rounds_per_step"] for r in comm_rows]),
            "micro_steps": statistics.median([r["micro_steps"] or 0 for r in comm_rows]),
            "extra_rounds_exposed_s": c["extra_rounds_exposed_s"],
            "extra_rounds_in_flight_s": c["extra_rounds_in_flight_s"],
            "bytes_per_round": c["bytes_per_round"],
            # the rank that waited least: its in-flight time is the collective's, not waiting
            "busbw_Bps": c["busbw_Bps"],
            "algbw_Bps": c["algbw_Bps"],
            "backend": c["backend"], "clock": c["clock"], "link": c["link"],
            "waiting": [{"rank": r["rank"],
                         "waiting_s": max(0.0, (r["comm"]["exposed_s"] or 0.0) - (c["exposed_s"] or 0.0))}
                        for r in comm_rows],
        }
    return out


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


STRAGGLER_CONSISTENCY = 0.75  # the slowest rank is the busiest in at least this share of the steps


def _slowest(rows: list[dict]) -> dict:
    """The busiest rank, and by how much, from the ranks paired step by step: per step, its busy
    time (and each own phase) against the median of the other ranks' in that same step, then the
    median over the steps. Pairing cancels what slowed every rank in a step (the machine); the
    share of steps in which it was the busier says whether it is a straggler or noise."""
    slow = max(rows, key=lambda r: r["busy_s"])
    others = [r for r in rows if r is not slow]
    common = sorted(set(slow["_steps"]).intersection(*(set(r["_steps"]) for r in others)))
    if not common:
        return {}
    diffs, by_step = [], {}
    for i in common:
        diffs.append(slow["_steps"][i]["busy"] - statistics.median(r["_steps"][i]["busy"] for r in others))
        for p in slow["_steps"][i]["own"]:
            mine = slow["_steps"][i]["own"][p]
            by_step.setdefault(p, []).append(mine - statistics.median(r["_steps"][i]["own"].get(p, 0.0) for r in others))
    extra = statistics.median(diffs)
    by_phase = {p: statistics.median(v) for p, v in by_step.items()}
    phase = max(by_phase, key=by_phase.get) if by_phase else None
    base_busy = slow["busy_s"] - extra
    return {"rank": slow["rank"], "extra_s": extra, "step_s": slow["step_s"],
            "extra_share": min(1.0, max(0.0, extra) / slow["step_s"]) if slow["step_s"] else None,
            "consistency": sum(d > 0 for d in diffs) / len(diffs), "steps_compared": len(diffs),
            # how much the per-step difference itself varies (median absolute deviation)
            "noise_s": statistics.median(abs(d - extra) for d in diffs),
            "phase": phase, "phase_extra_s": by_phase.get(phase) if phase else None,
            "by_phase_s": by_phase, "others_busy_s": base_busy}
