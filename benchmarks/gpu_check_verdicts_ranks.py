"""gpu_check's verdicts on data parallel runs on one GPU (NCCL): one DDP rank's all-reduce meter,
one FSDP2 rank, and a rank interrupted mid-run.

Pure: nothing here runs gpuprof or touches a GPU (tests/benchmarks/test_gpu_check.py drives it
with synthetic profiles)."""

from __future__ import annotations

from gpu_check_profile import Missing, lookup

INTERRUPT_BOUND_S = 60.0  # SIGINT mid-step -> gpuprof exits with the rank's entry written, at most


def rank_entry(p, rank: int = 0) -> dict | None:
    return next((e for e in (p.get("ranks") or []) if isinstance(e, dict) and e.get("rank") == rank), None)


def ok_rank0(p, problems: list[str]) -> tuple[dict | None, dict]:
    """(rank 0's entry, its own profile ({} when it wrote none)), a problem noted unless it ended
    "ok"; (None, {}) when the merged profile has no entry for rank 0."""
    e = rank_entry(p)
    if e is None:
        return None, {}
    if e.get("status") != "ok":
        problems.append(f"rank 0 ended {e.get('status')!r}: {(e.get('error') or {}).get('message')}")
    return e, e.get("profile") or {}


def judge_fsdp(p) -> tuple[bool, str]:
    """One FSDP2 rank on NCCL, cuda:0: it finished, the sharding was read, every measured step is
    on the GPU timeline, and no post-run part ran the sharded model (each says why). With one
    rank FSDP2 runs no collective: there is no `comm` to judge."""
    problems: list[str] = []
    e, rp = ok_rank0(p, problems)
    if e is None:
        return False, "no entry for rank 0 in the profile's ranks"
    kind = lookup(rp, "measurements.sharding.kind")
    if kind != "fsdp2":
        problems.append(f"sharding.kind is {kind!r}, expected 'fsdp2'")
    steps = rp.get("steps") or []
    if len(steps) < 3 or any(s.get("gpu_s") is None for s in steps):
        problems.append(f"{len(steps)} measured steps, {sum(s.get('gpu_s') is None for s in steps)} off the GPU timeline")
    for path in ("measurements.microbatch.not_measured", "measurements.probe.precisions.not_measured"):
        why = lookup(rp, path)
        if not isinstance(why, str) or "sharded (FSDP2)" not in why:
            problems.append(f"{path} is {why!r}: the sharded model was not refused")
    # where FSDP2 ran its all-gathers even on one rank, each was timed on FSDP's own stream
    gathers = [((s.get("extra") or {}).get("collectives") or {}).get("all_gather") for s in steps]
    gathers = [g for g in gathers if g and g.get("calls")]
    timed = ""
    if gathers:
        untimed = sum(1 for g in gathers if not g.get("gpu_seconds"))
        unread = lookup(rp, "measurements.collectives.gpu_calls_unread")
        if untimed:
            problems.append(f"{untimed} of {len(gathers)} steps' all-gathers have no gpu_seconds (FSDP's stream not timed)")
        if unread not in (0, None) and not isinstance(unread, Missing):
            problems.append(f"{unread} collectives' CUDA events were never read")
        timed = (f"; all-gathers {sum(g['gpu_seconds'] for g in gathers) / len(gathers) * 1e3:.2f} ms per step in "
                 f"flight on FSDP's stream" if not untimed else "")
    if problems:
        return False, "; ".join(problems)
    return True, (f"FSDP2 on one GPU: {len(steps)} steps on the GPU timeline; the post-run parts refused the sharded "
                  f"model{timed}")


def judge_nccl(p) -> tuple[bool, str]:
    """One NCCL rank with DDP on cuda:0: the all-reduce meter counted every round on CUDA events,
    in flight and exposed measured, no mark failed, busbw not given for one rank, and the rank ran
    with the NCCL settings that keep its entry on a timeout."""
    problems: list[str] = []
    e, rp = ok_rank0(p, problems)
    if e is None:
        return False, "no entry for rank 0 in the profile's ranks"
    comm = lookup(rp, "measurements.comm")
    if isinstance(comm, Missing):
        return False, comm.why
    expect = {"backend": "nccl", "clock": "cuda events", "world_size": 1, "rounds_per_step": 1,
              "incomplete_rounds": 0, "busbw_Bps": None}
    for k, want in expect.items():
        if comm.get(k) != want:
            problems.append(f"comm.{k} is {comm.get(k)!r}, expected {want!r}")
    if comm.get("mark_errors"):
        problems.append(f"marks failed: {comm['mark_errors']}")
    steps = comm.get("measured_steps")
    if not steps or steps != len(rp.get("steps") or []):
        problems.append(f"comm measured {steps!r} steps of {len(rp.get('steps') or [])}")
    fl, ex = comm.get("in_flight_s"), comm.get("exposed_s")
    if not isinstance(fl, (int, float)) or fl <= 0:
        problems.append(f"in-flight time {fl!r}, expected > 0")
    elif not isinstance(ex, (int, float)) or not 0 <= ex <= fl:
        problems.append(f"exposed {ex!r} s outside [0, in flight {fl:.6f} s]")
    if (e.get("nccl_env") or {}).get("TORCH_NCCL_ASYNC_ERROR_HANDLING") != "2":
        problems.append(f"the rank ran with NCCL env {e.get('nccl_env')!r}, not CleanUpOnly (2)")
    if lookup(rp, "measurements.timer.gpu_timeline") is not True:
        problems.append(f"no GPU timeline: {lookup(rp, 'measurements.timer.reasons')}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{steps} steps, 1 round each on CUDA events: in flight {fl * 1e3:.3f} ms, exposed "
                  f"{ex * 1e3:.3f} ms; busbw not given for one rank; NCCL CleanUpOnly")


def judge_interrupted_rank(p, rc, wall_s: float, bound_s: float = INTERRUPT_BOUND_S) -> tuple[bool, str]:
    """SIGINT mid-step: exit 130 within the bound, rank 0's entry written "interrupted" with its
    completed steps, no post-run work."""
    problems: list[str] = []
    if rc != 130:
        problems.append(f"exit code {rc}, expected 130")
    if wall_s > bound_s:
        problems.append(f"took {wall_s:.1f} s after the signal, over {bound_s:.0f} s")
    e = rank_entry(p) if p is not None else None
    if e is None:
        return False, "; ".join(problems + ["no entry for rank 0 written"])
    n = len((e.get("profile") or {}).get("steps") or [])
    if e.get("status") != "interrupted":
        problems.append(f"rank 0 ended {e.get('status')!r}, expected 'interrupted'")
    if n < 3:
        problems.append(f"{n} measured steps kept, expected at least 3")
    if problems:
        return False, "; ".join(problems)
    return True, f"exit 130 {wall_s:.1f} s after SIGINT, rank 0 interrupted with {n} measured steps kept"
