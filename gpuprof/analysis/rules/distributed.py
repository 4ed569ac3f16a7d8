"""Rules for data-parallel runs: they read the ranks' figures together (gpuprof.analysis.distributed),
present only for a merged profile of several ranks.

- straggler-rank: one rank is busier than the others (step − its exposed all-reduce), paired step
  by step, by ≥ 5% of the step, in ≥ 75% of the steps and by ≥ 3× the per-step difference's own
  variation (median absolute deviation); every other rank waits that long in its
  all-reduce each step. Saving: the extra busy time.
- communication-exposed: the all-reduce time not hidden behind backward compute, on the rank
  that waited least (the others' extra exposure is waiting for a slower rank). Saving: that
  exposed time, an upper bound (hiding it all is the best case).
- ddp-sync-every-micro-step: with gradient accumulation, the gradients were all-reduced on more
  than one micro-step per optimizer step (no `no_sync()` / `require_backward_grad_sync`). Saving:
  the exposed all-reduce time of every round but the step's last, measured.
"""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import on_cuda, step_evidence, step_s
from gpuprof.analysis.rules.sharded import collectives_owner
from gpuprof.units import bytes_per_s, pct, seconds

STRAGGLER_MIN_SHARE = 0.05  # the slowest rank's extra busy time, as a share of the step
STRAGGLER_CONSISTENCY = 0.75  # ... and it was the busier rank in at least this share of the steps
STRAGGLER_NOISE = 3.0  # ... and its extra is this many times the per-step difference's own variation (MAD)
EXPOSED_MIN_SHARE = 0.05  # communication not hidden, as a share of the step


def _sharded(ctx: Context) -> bool:
    return ctx.distributed is not None and ctx.distributed.collectives is not None


def _collectives_words(ctx: Context) -> str:
    """ "FSDP's collectives", "DTensor's collectives" or both: where a sharded rank waits."""
    return f"{collectives_owner(ctx.distributed.collectives.by_kind)} collectives"


def _view_is(ctx: Context, rank: int) -> bool:
    return ctx.profile.run.get("rank") == rank


def straggler_rank(ctx: Context) -> list[Finding]:
    slow = ctx.distributed.slowest if ctx.distributed is not None else None
    if slow is None or not slow.step_s or not (slow.extra_s or 0) > 0 or slow.others_busy_s is None:
        return []
    step, extra = slow.step_s, slow.extra_s
    share = extra / (step_s(ctx) or step)  # the denominator of every share (the typical step)
    consistency, noise = slow.consistency, slow.noise_s
    if share < STRAGGLER_MIN_SHARE or (consistency is not None and consistency < STRAGGLER_CONSISTENCY) \
            or (noise is not None and extra < STRAGGLER_NOISE * noise):
        return []  # too small, busier in too few steps, or within the step-to-step variation
    phase, pextra = slow.phase, slow.phase_extra_s
    where = (f"{phase}: +{seconds(pextra)} per step against the median of the other ranks"
             if phase and pextra and pextra > 0 else "no single phase")
    device = ("that rank's GPU: clocks, thermals, other processes (nvidia-smi)" if on_cuda(ctx)
              else "that rank's host: its CPU cores and the processes sharing them (top)")
    fixes = {
        "data": "give that rank's data path what the others have (its disk, its loader workers, "
                "its CPU cores: check what else runs on its host)",
        "h2d": "pinned memory and non_blocking copies on that rank; check its PCIe link",
        "forward": f"check {device}",
        "backward": f"check {device}",
        "optimizer": f"check {device}: the optimizer step is the same work on every rank",
    }
    sharded = _sharded(ctx)
    return [Finding(
        id="straggler-rank",
        title=f"rank {slow.rank} is the straggler: {seconds(extra)} slower per step, in {phase or 'several phases'}",
        saving_s=extra, kind="fix", confidence="high" if share > 0.2 else "medium",
        # The view of a merged profile is the slowest rank: its extra time is in that phase there,
        # the same interval a single-rank rule on that phase (e.g. data-loading-exposed) claims.
        claims={phase: min(pextra, extra)} if phase and pextra and pextra > 0 and _view_is(ctx, slow.rank) else {},
        evidence={"rank": slow.rank, "extra_s": extra, **step_evidence(ctx), "phase": phase,
                  "consistency": consistency, "steps_compared": slow.steps_compared,
                  "noise_s": noise,
                  "phase_extra_s": pextra, "others_busy_s": slow.others_busy_s,
                  "by_phase_s": slow.by_phase_s},
        because=(f"rank {slow.rank} computes for {seconds(slow.others_busy_s + extra)} of a "
                 f"{seconds(step)} step, the median other rank for {seconds(slow.others_busy_s)}; "
                 f"the others wait that {seconds(extra)} in their "
                 f"{_collectives_words(ctx) if sharded else 'all-reduce'} ({pct(share)} of the step"
                 + (f"; it was the busier in {pct(consistency, 0)} of {slow.steps_compared} steps"
                    if consistency is not None else "") + f"). Its extra time is in {where}."),
        fix=fixes.get(phase, "find what makes that rank slower (host, GPU, data)"),
        note=(f"a sharded step lasts as long as its slowest rank: every rank waits for it in "
              f"{_collectives_words(ctx)}"
              if sharded else "a synchronous data-parallel step lasts as long as its slowest rank"),
    )]


def communication_exposed(ctx: Context) -> list[Finding]:
    comm = ctx.distributed.communication if ctx.distributed is not None else None
    if comm is None or not comm.step_s or comm.exposed_s is None:
        return []
    step, total = comm.step_s, comm.exposed_s
    # The extra all-reduces of micro-steps that need none are ddp-sync-every-micro-step's saving:
    # this finding keeps what stays exposed once the step all-reduces once.
    extra = (comm.extra_rounds_exposed_s or 0.0) if _syncs_every_micro(comm) else 0.0
    exposed = max(0.0, total - extra)
    share = exposed / (step_s(ctx) or step)
    if share < EXPOSED_MIN_SHARE:
        return []
    bw = comm.busbw_Bps
    link = comm.link or {}
    nominal = link.get("nominal_Bps")
    bw_text = (f"bus bandwidth {bytes_per_s(bw)}" if bw else "bus bandwidth not measured")
    if bw and nominal:
        bw_text += f", {pct(bw / nominal)} of the {link.get('name')} figure ({bytes_per_s(nominal)} per direction)"
    elif bw:
        bw_text += f" ({link.get('why') or 'no nominal figure for this link'})"
    overlap = comm.overlap_share
    return [Finding(
        id="communication-exposed",
        title=f"the gradient all-reduce is not hidden: {seconds(exposed)} per step ({pct(share)}) after backward",
        saving_s=exposed, kind="fix", confidence="medium",
        evidence={"rank": comm.rank, "exposed_s": exposed, "exposed_total_s": total,
                  "extra_rounds_exposed_s": extra, "in_flight_s": comm.in_flight_s,
                  "overlap_share": overlap, **step_evidence(ctx), "busbw_Bps": bw, "nominal_Bps": nominal,
                  "bytes_per_round": comm.bytes_per_round, "rounds_per_step": comm.rounds_per_step},
        claims={"backward": exposed},
        because=(f"on rank {comm.rank} (the rank that waited least), the all-reduce was in flight "
                 f"{seconds(comm.in_flight_s)} per step, "
                 f"{seconds(total)} of it after the backward compute had ended "
                 f"({'overlap not measured' if overlap is None else pct(overlap) + ' overlapped'})"
                 + (f", {seconds(extra)} of which on the micro-steps that need no all-reduce "
                    f"(see ddp-sync-every-micro-step)" if extra else "")
                 + f"; {bw_text}."),
        fix=("hide it behind more compute per all-reduce: more gradient accumulation per optimizer step "
             "(all-reduce once per step), or a larger micro-batch; DDP(bucket_cap_mb=...) larger buckets "
             "start earlier and run fewer; gradient compression (bf16 comm hook) halves the bytes"),
        note="upper bound: all of it hidden is the best case",
    )]


def _syncs_every_micro(comm) -> bool:
    return (comm.micro_steps or 0) > 1 and (comm.rounds_per_step or 0) > 1


def ddp_sync_every_micro_step(ctx: Context) -> list[Finding]:
    comm = ctx.distributed.communication if ctx.distributed is not None else None
    if comm is None or not _syncs_every_micro(comm):
        return []
    rounds, micro = comm.rounds_per_step, comm.micro_steps
    saving = comm.extra_rounds_exposed_s or 0.0
    in_flight = comm.extra_rounds_in_flight_s
    return [Finding(
        id="ddp-sync-every-micro-step",
        title=f"gradients are all-reduced on {rounds:g} of {micro:g} micro-steps per step (no no_sync)",
        saving_s=saving, kind="fix", confidence="high",
        evidence={"rounds_per_step": rounds, "micro_steps": micro, "extra_rounds_exposed_s": saving,
                  "extra_rounds_in_flight_s": in_flight, **step_evidence(ctx)},
        claims={"backward": saving},
        because=(f"DDP all-reduced the gradients {rounds:g} times per optimizer step for {micro:g} "
                 f"micro-steps; the {rounds - 1:g} extra all-reduces were in flight {seconds(in_flight)} "
                 f"per step and held the step {seconds(saving)} after their backward compute."),
        fix=("skip the all-reduce on all micro-steps but the last: `with model.no_sync():` around "
             "their forward and backward, or nanoGPT's `model.require_backward_grad_sync = "
             "(micro_step == gradient_accumulation_steps - 1)`"),
        note=("saving = (accum − 1) × one all-reduce's exposed time, measured; the in-flight time "
              "that overlapped compute is not counted"),
    )]


RULES = [straggler_rank, communication_exposed, ddp_sync_every_micro_step]
