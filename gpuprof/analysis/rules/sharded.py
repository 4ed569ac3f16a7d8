"""Rules for sharded training (FSDP2, and DTensor's collectives: tensor parallelism), from the
ranks' collectives together (the `collectives` of gpuprof.analysis.distributed: the figures of the
rank that waited least, i.e. what the collectives themselves cost, not the waiting for a slower
rank) and the model's sharding (measurements.sharding, gpuprof.measure.sharding). The straggler
is distributed.py's rule.

- fsdp-reduce-every-micro-step: with gradient accumulation, FSDP reduce-scattered the gradients
  on every micro-step. Saving: the reduce-scatters of all micro-steps but the last, measured.
  Cost: each rank keeps the unsharded gradients until the last micro-step.
- fsdp-backward-regather: units resharded after forward are all-gathered again in backward.
  Saving: those backward all-gathers (and their copy-out), measured. Cost: those units' unsharded
  parameters stay allocated from forward to backward.
- sharded-memory: what a rank holds of the training state (parameters, gradients, optimizer state:
  its shards, read from the tensors), what it would hold unsharded, and on CUDA (the measured peak
  and capacity) whether the model would fit each GPU without sharding. Information.
- fsdp-root-unit-large, fsdp-units-tiny (fsdp_wrap_granularity): a root unit holding the
  embeddings and head (one large all-gather before the first block, nothing to hide it behind),
  or many tiny units (a collective's fixed latency each). From the units' sizes. Information.
- collectives-exposed: what FSDP's (and DTensor's) collectives take of the step, kind by kind, with the bus
  bandwidth and, for fp32 parameters, what MixedPrecisionPolicy(param_dtype=bf16) does to the
  all-gather bytes (stated, not timed). Information.
"""

from __future__ import annotations

from dataclasses import asdict

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import on_cuda, step_evidence, step_s
from gpuprof.recommend.memory import DEFAULT_MARGIN as MEMORY_MARGIN
from gpuprof.units import UNKNOWN, bytes_per_s, count, nbytes, pct, seconds

COLLECTIVE_NAMES = {"all_gather": "all-gather", "all_gather_wait": "all-gather wait and copy-out",
                    "reduce_scatter": "reduce-scatter",
                    # DTensor's functional collectives (gpuprof.measure.funcol_hooks)
                    "funcol_all_reduce": "DTensor all-reduce", "funcol_all_gather": "DTensor all-gather",
                    "funcol_reduce_scatter": "DTensor reduce-scatter", "funcol_all_to_all": "DTensor all-to-all",
                    "funcol_broadcast": "DTensor broadcast", "funcol_permute": "DTensor permute",
                    "funcol_wait": "DTensor wait (issued inside autograd)"}


def collectives_owner(kinds) -> str:
    """Whose collectives a run's kinds are, in words: "FSDP's", "DTensor's" or both."""
    kinds = set(kinds)
    fsdp = bool(kinds & {"all_gather", "all_gather_wait", "reduce_scatter"})
    dtensor = any(k.startswith("funcol_") for k in kinds)
    return "FSDP's and DTensor's" if fsdp and dtensor else ("DTensor's" if dtensor else "FSDP's")
MIN_SHARE = 0.02  # a measured saving under this share of the step is not worth a fix here
BYTES_FP32 = 4


def collectives_line(c) -> str:
    """FSDP2's collectives per step, on the rank that waited least (JobCollectives of
    analysis.distributed_results): each kind's calls, bytes, host time and bus bandwidth, and what
    was exposed. The findings below give it as their evidence; the report's ranks section prints it."""
    parts = []
    for kind, k in c.by_kind.items():
        text = (f"{COLLECTIVE_NAMES.get(kind, kind)} {k.calls}× ({k.backward_calls} in backward)"
                + (f", {nbytes(k.bytes)}" if k.bytes else "") + f", {seconds(k.seconds)}")
        if kind.startswith("funcol_") and k.in_flight_seconds:
            text += f" blocked of {seconds(k.in_flight_seconds)} in flight"
        if k.gpu_seconds:
            text += f" to enqueue, {seconds(k.gpu_seconds)} in flight on FSDP's stream"
        if k.busbw_Bps:
            text += f", bus bandwidth {bytes_per_s(k.busbw_Bps)}"
        parts.append(text)
    share = f" ({pct(c.exposed_s / c.step_s)} of the step)" if c.step_s and c.exposed_s is not None else ""
    owner = collectives_owner(c.by_kind).replace("'s", "")
    return (f"{owner} collectives per step on rank {c.rank} (the rank that waited least; {c.backend or UNKNOWN}, "
            f"{c.clock or 'host'} clock): " + "; ".join(parts)
            + f"; in all {seconds(c.exposed_s)} on the step's critical path{share}")


def _collectives(ctx: Context):
    """The job's FSDP2 collectives (distributed_results.JobCollectives), None when not measured."""
    c = ctx.distributed.collectives if ctx.distributed is not None else None
    return c if c is not None and c.by_kind else None


def _sharding(ctx: Context) -> dict:
    s = ctx.measurements.get("sharding")
    return s if isinstance(s, dict) else {}


def _timed(k, backward: bool = False) -> tuple[float, bool]:
    """A kind's seconds for a saving, and whether they are in flight on FSDP's stream (CUDA: its
    host seconds are the enqueueing; in flight is an upper bound, prefetching may hide some of
    it behind compute) rather than host time (gloo: synchronous, all of it on the step's path)."""
    gpu = k.gpu_backward_seconds if backward else k.gpu_seconds
    if gpu:
        return gpu, True
    return (k.backward_seconds if backward else k.seconds), False


GPU_BOUND_NOTE = ("on CUDA the figure is the time in flight on FSDP's own stream (CUDA events): an upper bound, "
                  "since prefetching hides part of it behind compute")


def fsdp_reduce_every_micro_step(ctx: Context) -> list[Finding]:
    c = _collectives(ctx)
    rs = c.by_kind.get("reduce_scatter") if c is not None else None
    micro = int(c.micro_steps or 0) if c is not None else 0
    units = len(_sharding(ctx).get("units") or [])
    if rs is None or micro < 2 or not units or rs.calls <= units:
        return []  # one reduction per unit per step: already once per optimizer step
    reduced = min(micro, round(rs.calls / units))  # micro-steps that reduce-scattered
    rs_s, in_flight = _timed(rs)
    saving = rs_s * (reduced - 1) / reduced
    total = step_s(ctx) or c.step_s or 0.0
    if not total or saving / total < MIN_SHARE:
        return []
    world = c.world or 1
    grads = (_sharding(ctx).get("params_total") or 0) * BYTES_FP32
    return [Finding(
        id="fsdp-reduce-every-micro-step",
        title=f"gradients are reduce-scattered on {reduced} of {micro} micro-steps per step",
        saving_s=saving, kind="fix", confidence="low" if in_flight else "high",
        evidence={"reduce_scatter_calls": rs.calls, "units": units, "micro_steps": micro,
                  "reduce_scatter_s": rs_s, "in_flight": in_flight, "rank": c.rank, **step_evidence(ctx)},
        claims={"comm": saving},
        because=(f"on rank {c.rank} (the rank that waited least), FSDP ran {rs.calls} reduce-scatters per "
                 f"optimizer step for {units} units × {micro} micro-steps, {seconds(rs_s)} in all"
                 f"{' in flight' if in_flight else ''}; the "
                 f"{reduced - 1} of {reduced} micro-steps that are not the step's last need none"),
        fix=("reduce once per optimizer step: `model.set_requires_gradient_sync(micro_step == "
             "gradient_accumulation_steps - 1)` before each micro-step's backward (FSDP2's no_sync)"),
        note=(f"saving = the measured reduce-scatter time × {reduced - 1}/{reduced}; memory: each rank keeps the "
              f"unsharded gradients until the last micro-step, ~{nbytes(grads)} in fp32 where it keeps a "
              f"1/{world} shard now" + (f"; {GPU_BOUND_NOTE}" if in_flight else "")),
    )]


def fsdp_backward_regather(ctx: Context) -> list[Finding]:
    c = _collectives(ctx)
    kinds = c.by_kind if c is not None else {}
    ag, wait = kinds.get("all_gather"), kinds.get("all_gather_wait")
    if ag is None or not ag.backward_calls:
        return []
    ag_s, in_flight = _timed(ag, backward=True)
    # on CUDA the copy-out's wait is not the collective's time (it is on the GPU timeline's comm)
    saving = ag_s + (wait.backward_seconds if wait is not None and not in_flight else 0.0)
    total = step_s(ctx) or c.step_s or 0.0
    if not total or saving / total < MIN_SHARE:
        return []
    units = [u for u in _sharding(ctx).get("units") or [] if u.get("reshard_after_forward")]
    world = c.world or 1
    held = sum(u.get("params") or 0 for u in units) * BYTES_FP32 * (world - 1) / world
    names = ", ".join(u["module"] for u in units[:4]) + (f" and {len(units) - 4} more" if len(units) > 4 else "")
    return [Finding(
        id="fsdp-backward-regather",
        title=f"{ag.backward_calls} all-gathers per step run again in backward (reshard_after_forward=True)",
        saving_s=saving, kind="fix", confidence="low" if in_flight else "medium",
        evidence={"backward_all_gathers": ag.backward_calls, "backward_all_gather_s": saving, "in_flight": in_flight,
                  "units_resharded": len(units), "rank": c.rank, **step_evidence(ctx)},
        claims={"comm": saving},
        because=(f"on rank {c.rank} (the rank that waited least), {ag.backward_calls} of {ag.calls} "
                 f"all-gathers per step came in backward, {seconds(saving)}"
                 f"{' in flight' if in_flight else ' with their copy-out'}: units resharded "
                 f"after forward ({names or 'not read'}) gather their parameters again for backward"),
        fix=("fully_shard(block, reshard_after_forward=False) for the last blocks (their backward follows their "
             "forward soonest), or for all of them when memory allows"),
        note=((f"saving = those backward all-gathers, measured; memory: their parameters stay unsharded from "
               f"forward to backward, ~{nbytes(held)} more per rank for all {len(units)} units in fp32"
               if units else "saving = those backward all-gathers, measured; the units' sizes were not read")
              + (f"; {GPU_BOUND_NOTE}" if in_flight else "")),
    )]


def collectives_exposed(ctx: Context) -> list[Finding]:
    c = _collectives(ctx)
    total = step_s(ctx) or (c.step_s if c is not None else 0.0) or 0.0
    if c is None or not total or (c.exposed_s or 0.0) / total < 0.05:
        return []
    units = _sharding(ctx).get("units") or []
    ag = c.by_kind.get("all_gather")
    fp32 = units and all(u.get("param_dtype") in (None, "float32") for u in units) and \
        ctx.sections.precision.param_dtype in (None, "float32")
    note = ("no datasheet figure for this link: gloo between processes of one host" if c.backend == "gloo"
            else "compare the bus bandwidth with the link's per-direction figure")
    if ag is not None:
        change = ("hide the all-gathers behind compute: FSDP2 prefetches one unit ahead by default; "
                  "set_modules_to_forward_prefetch / set_modules_to_backward_prefetch fetch further ahead")
    else:  # tensor parallelism alone: its collectives sit between the ops that need them
        change = ("fewer or smaller tensor-parallel collectives: a larger tensor-parallel degree only where the "
                  "layers are large enough to hide them, or sequence parallelism (SequenceParallel) in place of "
                  "replicated activations; not timed here")
    if fp32 and ag is not None and ag.bytes:
        change += (f"; MixedPrecisionPolicy(param_dtype=torch.bfloat16) in fully_shard halves the all-gather "
                   f"bytes ({nbytes(ag.bytes)} → {nbytes(ag.bytes / 2)} per step; not timed here)")
    return [Finding(
        id="collectives-exposed",
        title=(f"{collectives_owner(c.by_kind)} collectives take {pct(c.exposed_s / total)} of the step "
               f"({seconds(c.exposed_s)})"),
        saving_s=None, kind="info", confidence="high",
        evidence={"rank": c.rank, "exposed_s": c.exposed_s, **step_evidence(ctx),
                  "by_kind": {k: asdict(v) for k, v in c.by_kind.items()}, "backend": c.backend},
        because=collectives_line(c), fix=change, note=note,
    )]


def sharded_memory(ctx: Context) -> list[Finding]:
    """What a rank holds of the training state (measurements.sharding.memory, read from the
    tensors after the run), what it would hold unsharded, and on CUDA whether that fits the GPU."""
    sh = _sharding(ctx)
    mem = sh.get("memory") or {}
    p_total, p_local = mem.get("param_bytes_total"), mem.get("param_bytes_local")
    if not p_total or p_local is None:
        return []
    g_local = mem.get("grad_bytes_local")
    o_local, o_total = mem.get("optimizer_state_bytes_local"), mem.get("optimizer_state_bytes_total")
    # gradients take the parameters' bytes (FSDP2 and DTensor keep them in the parameters' layout)
    held = p_local + (g_local if g_local is not None else p_local) + (o_local or 0)
    whole = 2 * p_total + (o_total or 0)
    optimizer = mem.get("optimizer") or "optimizer"
    because = (f"parameters {nbytes(p_local)} of {nbytes(p_total)}; gradients "
               + (f"{nbytes(g_local)}" if g_local is not None else "not held when read (set to None): counted as the "
                  "parameters' shard")
               + (f"; {optimizer} state {nbytes(o_local)} of {nbytes(o_total)}" if o_local is not None
                  else "; no optimizer state read")
               + f": {nbytes(held)} on this rank, {nbytes(whole)} unsharded")
    ev = {"param_bytes_local": p_local, "param_bytes_total": p_total, "grad_bytes_local": g_local,
          "optimizer_state_bytes_local": o_local, "optimizer_state_bytes_total": o_total,
          "held_bytes": held, "unsharded_bytes": whole}
    title = f"each rank holds {nbytes(held)} of the training state, {nbytes(whole)} unsharded"
    mems = ctx.sections.memory
    peak, cap = mems.peak_allocated_bytes, mems.capacity_bytes
    if sh.get("kind") != "fsdp2":
        note = ("tensor parallelism shards the activations too: whether the model fits unsharded is not "
                "judged from these figures")
    elif not (on_cuda(ctx) and peak and cap):
        note = "whether it fits unsharded: not measured (no device memory peak and capacity in this run)"
    else:
        need = peak + whole - held  # the peak holds this rank's activations and its shards now
        usable = cap * (1 - MEMORY_MARGIN)
        ev.update(peak_allocated_bytes=peak, capacity_bytes=cap, unsharded_peak_bytes=need)
        because += (f"; peak allocated {nbytes(peak)} of {nbytes(cap)}, so unsharded about {nbytes(need)} "
                    f"({pct(need / cap)} of the GPU)")
        if need <= usable:
            title = f"the model would fit on each GPU without sharding ({nbytes(need)} of {nbytes(cap)})"
            note = ("plain data parallelism (DDP) would hold it whole on every rank: no all-gathers, one "
                    "all-reduce of the gradients per step instead of the reduce-scatters (not timed here); "
                    f"estimate: the measured peak + the state FSDP shards away, with {pct(MEMORY_MARGIN, 0)} kept "
                    "as margin")
        else:
            note = (f"it would not fit unsharded (over {pct(1 - MEMORY_MARGIN, 0)} of the GPU): sharding is "
                    "needed here")
    return [Finding(
        id="sharded-memory", title=title, saving_s=None, kind="info", confidence="medium",
        evidence={**ev, **step_evidence(ctx)}, because=because, note=note,
    )]


ROOT_MIN_SHARE = 0.2  # a root unit holding this share of the parameters ...
ROOT_MIN_RATIO = 2.0  # ... and this many times the median other unit is one all-gather too large
TINY_UNIT_BYTES = 1 << 20  # units whose median all-gather is under this are latency-bound ...
TINY_UNITS_MIN = 16  # ... when there are at least this many of them


def fsdp_wrap_granularity(ctx: Context) -> list[Finding]:
    """How the model was cut into FSDP2 units (measurements.sharding.units): a root unit that holds
    the embeddings and head gathers them in one all-gather before the first block, with no compute
    to hide behind; many tiny units pay a collective's fixed latency each. From the structure:
    information, nothing timed per unit."""
    sh = _sharding(ctx)
    units = [u for u in sh.get("units") or [] if u.get("params")]
    if sh.get("kind") != "fsdp2" or len(units) < 2:
        return []
    total = sum(u["params"] for u in units)
    root = next((u for u in units if u["module"] == "(root)"), None)
    others = sorted(u["params"] for u in units if u is not root)
    median_other = others[len(others) // 2]
    c = _collectives(ctx)
    ag = c.by_kind.get("all_gather") if c is not None else None
    found = []
    if root is not None and root["params"] >= ROOT_MIN_SHARE * total and root["params"] >= ROOT_MIN_RATIO * median_other:
        share = root["params"] / total
        timed = (f"; FSDP's all-gathers took {seconds(ag.seconds)} per step on rank {c.rank}, the root's bytes "
                 f"{pct(share)} of them" if ag is not None and ag.seconds else "")
        found.append(Finding(
            id="fsdp-root-unit-large",
            title=f"the root FSDP unit holds {pct(share)} of the parameters in one all-gather",
            saving_s=None, kind="info", confidence="medium",
            evidence={"root_params": root["params"], "params": total, "median_unit_params": median_other,
                      "units": len(units), **step_evidence(ctx)},
            because=(f"the root unit (what no block's fully_shard took: the embeddings, the final norm, the head) "
                     f"holds {count(root['params'])} of {count(total)} parameters, {root['params'] / median_other:.1f}× "
                     f"the median other unit ({count(median_other)}); it is all-gathered before the first block's "
                     f"forward, with no earlier compute to hide it behind, and reduce-scattered after the last "
                     f"backward" + timed),
            fix=("fully_shard the embeddings and the output head as units of their own before the root "
                 "(torchtitan: fully_shard(model.tok_embeddings), fully_shard([model.norm, model.output])), so the "
                 "first all-gather is small and the head's overlaps the blocks' compute"),
            note="from the units' sizes; the saving is not timed here (on gloo every collective is synchronous)",
        ))
    if len(units) >= TINY_UNITS_MIN and median_other * BYTES_FP32 < TINY_UNIT_BYTES:
        found.append(Finding(
            id="fsdp-units-tiny",
            title=f"{len(units)} FSDP units of {nbytes(median_other * BYTES_FP32)} each (median): many small collectives",
            saving_s=None, kind="info", confidence="medium",
            evidence={"units": len(units), "median_unit_params": median_other, **step_evidence(ctx)},
            because=(f"{len(units)} units, median {count(median_other)} parameters: every unit pays an all-gather and a "
                     f"reduce-scatter per micro-step, each with a fixed latency that bytes this small do not amortise"),
            fix="wrap several blocks per fully_shard call (one unit per group of blocks), so each collective moves more",
            note="from the units' sizes; the saving is not timed here",
        ))
    return found


RULES = [fsdp_reduce_every_micro_step, fsdp_backward_regather, collectives_exposed, sharded_memory,
         fsdp_wrap_granularity]
