"""What a data-parallel run's ranks say together: per rank its step, phases and all-reduce
figures, the slowest rank, and the job's communication. Pure: a function of the rank entries of
a merged profile (Profile.ranks, gpuprof.merge), computed by the analysis, never stored as a
measurement.

Comparing ranks separates communication from waiting. In synchronous data parallelism every rank
ends its backward when the slowest rank's gradients arrive, so all step times are alike and a
fast rank's extra time hides in its all-reduce ("exposed": after its own backward compute). A
sharded (FSDP2) rank waits inside its collectives instead: its all-gathers before each unit's
forward and backward, its reduce-scatters after each backward (the `comm` phase,
gpuprof.measure.collective_hooks). A rank's busy time = its step − its exposed communication
(DDP's all-reduce after the backward, or FSDP's `comm`); the slowest rank is the busiest, by
how much it exceeds the median of the others, in the phase that grew most. The rank that waited
least shows what communication itself costs (the others' extra exposure is waiting for it).
Every median here is gpuprof.stats's.
"""

from __future__ import annotations

from gpuprof.analysis.distributed_results import DistributedStats
from gpuprof.profile import Profile, rank_error_text
from gpuprof.stats import PHASES, median

METHOD = ("busy = step − exposed communication (DDP: the time after the rank's own backward compute spent "
          "waiting for the all-reduce; FSDP2: the `comm` phase, its collectives), the mean over the typical steps as "
          "the step is; the slowest rank is the busiest")
# kind -> nccl-tests' bus-bandwidth factor over (n−1)/n
BUS_FACTOR = {"all_gather": 1, "reduce_scatter": 1, "funcol_all_gather": 1, "funcol_reduce_scatter": 1,
              "funcol_all_reduce": 2}
COLLECTIVE_FIELDS = ("calls", "bytes", "seconds", "backward_calls", "backward_seconds", "wait_seconds",
                     "in_flight_seconds", "gpu_seconds", "gpu_backward_seconds")


def _comm(prof: Profile) -> dict | None:
    """A rank's all-reduce figures: medians over its measured steps, as CommMeter stores them."""
    c = prof.sections.comm
    if not c.present or c.not_measured is not None or not c.per_step:
        return None
    per = c.per_step
    return {"in_flight_s": median(s.in_flight_s for s in per),
            "exposed_s": median(s.exposed_s for s in per),
            "extra_rounds_exposed_s": median(s.extra_rounds_exposed_s for s in per),
            "extra_rounds_in_flight_s": median(s.extra_rounds_in_flight_s for s in per),
            "rounds_per_step": int(round(median(s.rounds for s in per))),  # a count: an int
            "bytes_per_round": c.bytes_per_round, "busbw_Bps": c.busbw_Bps,
            "algbw_Bps": c.algbw_Bps, "backend": c.backend, "clock": c.clock, "link": c.link}


def _collectives(prof: Profile) -> dict | None:
    """A rank's FSDP2 collectives (gpuprof.measure.collective_hooks): per kind, medians over its
    measured steps of calls, bytes, host seconds and how many came in the backward; exposed = the
    `comm` phase per step (median)."""
    steps = [s for s in prof.steps if (s.extra or {}).get("collectives")]
    if not steps:
        return None
    gpu = prof.stats.timeline == "gpu"
    kinds = sorted({k for s in steps for k in s.extra["collectives"]})
    by_kind = {}
    for k in kinds:
        vals = {f: median(float((s.extra["collectives"].get(k) or {}).get(f, 0)) for s in steps)
                for f in COLLECTIVE_FIELDS}
        by_kind[k] = {f: (int(round(v)) if f in ("calls", "bytes", "backward_calls") else v) for f, v in vals.items()}
    section = prof.measurements.get("collectives") or {}
    group = section.get("group") or {}
    return {"by_kind": by_kind, "exposed_s": median(((s.gpu_phases if gpu else s.phases) or {}).get("comm", 0.0)
                                                    for s in steps),
            "world": group.get("size"), "backend": group.get("backend"), "clock": section.get("clock"),
            "gpu_timeline": gpu}


def _busy(prof: Profile) -> dict:
    """Per measured step: busy = step − that step's exposed communication (DDP's all-reduce after
    the backward, taken out of the backward; or FSDP's `comm` phase), and each own phase (the
    rank's own compute). The row shows the means over the typical steps, as the rank's step
    (stats.step_s: the typical steps' phases, their mean) is taken, so busy sits within that step:
    a median over every step against the typical steps' mean read 12.45 ms busy in a step shorter
    than that on a two-node run. The per-step figures (`_steps`) pair the ranks step by step for
    the straggler."""
    exposed = {s.index: s.exposed_s for s in prof.sections.comm.per_step}
    gpu = prof.stats.timeline == "gpu"
    per: dict[int, dict] = {}
    for st in prof.steps:
        phases = (st.gpu_phases if gpu else st.phases) or {}
        total = sum(phases.values()) or ((st.gpu_s if gpu else st.wall_s) or 0.0)
        if st.index in exposed:
            e = min(exposed[st.index], total)
            own = {p: phases[p] - (e if p == "backward" else 0.0) for p in PHASES if p in phases}
        elif "comm" in phases:
            e = min(phases["comm"], total)
            own = {p: phases[p] for p in PHASES if p in phases and p != "comm"}
        else:
            continue
        per[st.index] = {"busy": total - e, "own": own}
    if not per:
        return {}
    typical = [per[i] for i in prof.stats.typical if i in per] or list(per.values())
    own_keys = {p for v in typical for p in v["own"]}
    return {"busy_s": sum(v["busy"] for v in typical) / len(typical),
            "own_phases": {p: sum(v["own"].get(p, 0.0) for v in typical) / len(typical)
                           for p in PHASES if p in own_keys},
            "_steps": per}


def _rank_row(e: dict) -> dict:
    row = {"rank": e["rank"], "node_rank": e.get("node_rank"), "host": e.get("host"),
           "status": e.get("status"), "error": rank_error_text(e) if e.get("status") != "ok" else None}
    if e.get("profile") is None:
        return row
    prof = Profile.from_dict(e["profile"])
    s = prof.stats
    if s is None:
        return row
    phases = {p: v.seconds for p, v in s.phases.items()}
    comm, collectives = _comm(prof), _collectives(prof)
    row["ended_in"] = prof.run.get("ended_in")
    row.update(step_s=s.step_s, phases=phases, data_s=phases.get("data", 0.0), micro_steps=s.micro_steps,
               tokens_per_step=s.tokens_per_step, n_steps=s.n_steps, comm=comm,
               comm_not_measured=prof.sections.comm.not_measured, collectives=collectives)
    if (comm is not None or collectives is not None) and s.step_s:
        row.update(_busy(prof))
    return row


def distributed_stats(entries: list[dict], world: int | None = None) -> DistributedStats:
    """The ranks together (module docstring), typed (gpuprof.analysis.distributed_results): world
    size, a row per rank, absent and failed ranks, the method, the slowest rank (when ≥ 2 ranks
    have communication figures), DDP's `communication`, FSDP2's `collectives`."""
    rows = [_rank_row(e) for e in sorted(entries, key=lambda e: e["rank"])]
    world = world or max([int(e.get("world_size") or 1) for e in entries] + [1])
    present = {r["rank"] for r in rows}
    out = {
        "world_size": world,
        "ranks": rows,
        "absent_ranks": [r for r in range(world) if r not in present],
        "failed_ranks": [r["rank"] for r in rows if r["status"] != "ok"],
        "method": METHOD,
    }
    measured = [r for r in rows if r.get("busy_s") is not None and r["status"] == "ok"]
    if len(measured) >= 2:
        slowest = _slowest(measured)
        if slowest:
            out["slowest"] = slowest
    for r in rows:
        r.pop("_steps", None)  # per-step pairs: the straggler's input, not kept
    coll_rows = [r for r in rows if r.get("collectives") and r["status"] == "ok"]
    if coll_rows:
        out["collectives"] = _job_collectives(coll_rows)
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
            # counts: ints, as the ranks' own (numpy's median of ints is a float)
            "rounds_per_step": int(round(median(r["comm"]["rounds_per_step"] for r in comm_rows))),
            "micro_steps": int(round(median(r["micro_steps"] or 0 for r in comm_rows))),
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
    return DistributedStats.from_dict(out)


def _job_collectives(rows: list[dict]) -> dict:
    """FSDP2's collectives for the job: the figures of the rank that waited least in them (what
    the collectives themselves cost), and every rank's waiting beyond it."""
    least = min(rows, key=lambda r: r["collectives"]["exposed_s"] or 0.0)
    c = least["collectives"]
    world = c.get("world") or len(rows)
    kinds = {}
    for kind, k in c["by_kind"].items():
        entry = dict(k)
        factor = BUS_FACTOR.get(kind)
        # the collective's own time: in flight on FSDP's stream on CUDA (its host seconds there
        # are the enqueueing), the host's (synchronous gloo; a functional collective's issue + wait)
        secs = k.get("gpu_seconds") or (0.0 if c.get("gpu_timeline") else k["seconds"])
        if factor is not None and secs and k["bytes"] and world > 1:
            # nccl-tests' convention: busbw = algbw × (n−1)/n (all-gather, reduce-scatter), × 2(n−1)/n
            # (all-reduce)
            entry["algbw_Bps"] = k["bytes"] / secs
            entry["busbw_Bps"] = entry["algbw_Bps"] * factor * (world - 1) / world
        kinds[kind] = entry
    return {"rank": least["rank"], "exposed_s": c["exposed_s"], "step_s": least["step_s"],
            "micro_steps": least.get("micro_steps"), "by_kind": kinds, "world": world,
            "backend": c.get("backend"), "clock": c.get("clock"),
            "waiting": [{"rank": r["rank"],
                         "waiting_s": max(0.0, (r["collectives"]["exposed_s"] or 0.0) - (c["exposed_s"] or 0.0))}
                        for r in rows]}


def slowest_rank(entries: list[dict]) -> int | None:
    """The busiest rank of a merged run (None when the communication was not measured on 2
    ranks): the view a merged profile shows (gpuprof.merge)."""
    slow = distributed_stats(entries).slowest
    return slow.rank if slow is not None else None


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
        diffs.append(slow["_steps"][i]["busy"] - median(r["_steps"][i]["busy"] for r in others))
        for p in slow["_steps"][i]["own"]:
            mine = slow["_steps"][i]["own"][p]
            by_step.setdefault(p, []).append(mine - median(r["_steps"][i]["own"].get(p, 0.0) for r in others))
    extra = median(diffs)
    by_phase = {p: median(v) for p, v in by_step.items()}
    phase = max(by_phase, key=by_phase.get) if by_phase else None
    base_busy = slow["busy_s"] - extra
    return {"rank": slow["rank"], "extra_s": extra, "step_s": slow["step_s"],
            "extra_share": min(1.0, max(0.0, extra) / slow["step_s"]) if slow["step_s"] else None,
            "consistency": sum(d > 0 for d in diffs) / len(diffs), "steps_compared": len(diffs),
            # how much the per-step difference itself varies (median absolute deviation)
            "noise_s": median(abs(d - extra) for d in diffs),
            "phase": phase, "phase_extra_s": by_phase.get(phase) if phase else None,
            "by_phase_s": by_phase, "others_busy_s": base_busy}
