"""Joining the per-rank profiles of a data-parallel run into one.

Each rank measures itself and writes its own profile (gpuprof.runners.rank); this module only
reads them, so a node's merge (done by gpuprof's launcher on that node) and an offline merge of
several nodes' files (`gpuprof merge`) are the same function of the same set of rank entries:
merging node files equals merging all their ranks at once.

A merged profile keeps every rank's whole profile under `ranks` and shows, at the top level, one
rank's steps and measurements: the slowest rank's (gpuprof.analysis.distributed's `slowest` — the
job runs at its pace, and its phases hold its own work rather than waiting for another rank),
or the lowest present rank when the ranks' all-reduces were not measured. `run.view` keeps what
that choice rests on — the rank, the rule's id, each rank's busy seconds per step
(gpuprof.analysis.distributed_results.MergedView) — and the report words it. What the ranks say
together (per-rank figures, the straggler, communication) is the analysis's, not stored here.
"""

from __future__ import annotations

import copy

from gpuprof.analysis.distributed import distributed_stats
from gpuprof.analysis.distributed_results import VIEW_LOWEST, VIEW_SLOWEST, MergedView
from gpuprof.errors import GpuprofError
from gpuprof.profile import Profile, rank_error_text


def entries_of(profile: Profile) -> list[dict]:
    """The rank entries a profile holds: its `ranks`, or itself as one rank."""
    if profile.ranks:
        return [dict(e) for e in profile.ranks]
    run = profile.run
    ended = run.get("ended", "finished")
    status = {"failed": "failed", "interrupted": "interrupted"}.get(ended, "ok")
    return [{"rank": int(run.get("rank", 0)), "local_rank": int(run.get("local_rank", 0) or 0),
             "node_rank": int(run.get("node_rank", 0) or 0), "host": run.get("host"),
             "world_size": int(run.get("world_size", 1)), "status": status, "error": run.get("error"),
             "profile": profile.to_dict()}]


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
        lines = "; ".join(f"rank {e['rank']}: {rank_error_text(e)}" for e in entries) or "no rank entries"
        raise GpuprofError(f"no rank completed a training step ({lines})")
    world = max(int(e.get("world_size") or 1) for e in entries)
    together = distributed_stats(entries)
    slow = together.slowest.rank if together.slowest is not None else None
    chosen = next((e for e in present if e["rank"] == slow), present[0])
    base = Profile.from_dict(copy.deepcopy(chosen["profile"]))
    nodes: dict[int, int] = {}
    for e in entries:
        if e.get("node_rank") is not None:  # a rank that died without a file may not know its node
            nodes[e["node_rank"]] = nodes.get(e["node_rank"], 0) + 1
    base.run = dict(base.run)
    base.run["world_size"] = world
    base.run["view"] = MergedView(
        rank=chosen["rank"], rule=VIEW_SLOWEST if chosen["rank"] == slow else VIEW_LOWEST,
        busy_s={r.rank: r.busy_s for r in together.ranks if r.busy_s is not None}).to_dict()
    base.run["launch"] = {"nnodes": max(1, len(nodes)), "nproc_per_node": max([*nodes.values(), 1]),
                          "world_size": world}
    base.ranks = [{**e, "profile": _strip(e.get("profile"))} for e in entries]
    return base


def _strip(prof: dict | None) -> dict | None:
    """A rank's profile as measured (schema 2: whatever a schema-1 rank derived is dropped)."""
    if prof is None:
        return None
    d = Profile.from_dict(copy.deepcopy(prof)).to_dict()
    d.pop("ranks", None)
    return d


