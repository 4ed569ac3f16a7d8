"""Rules about how the step's time splits into phases."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.analysis.rules.common import (
    COMPUTE_PHASES,
    exposed_s,
    mode,
    on_cuda,
    on_gpu_timeline,
    step_evidence,
    step_s,
    timeline_words,
)
from gpuprof.units import pct, seconds, times

PHASE_MEANING = {
    "data": "loading batches on the host",
    "h2d": "copying batches to the device",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "comm": ("collectives of a sharded model (FSDP's all-gathers and reduce-scatters, DTensor's functional "
             "collectives), waiting for peers included"),
    "optimizer": "clipping, the optimizer step and zero_grad",
    "other": "loop code outside the measured phases",
    "eval": "evaluation inside the training step",
}

DATA_EXPOSED_MIN_SHARE = 0.05  # torch-tb-profiler's DataLoader threshold
COMPUTE_BOUND_MAX_EXPOSED = 0.10
MAX_WORKERS_SUGGESTED = 8  # one per free core, and no more than this to start with
OTHERS_NAMED_SHARE = 0.20  # other processes' share of the cores worth naming in the note


def dominant_phase(ctx: Context) -> list[Finding]:
    """Names the phase that takes the largest share of the step (information, not a fix)."""
    phases = ctx.stats.phases
    if not phases:
        return []
    name, entry = max(phases.items(), key=lambda kv: kv[1].seconds)
    return [
        Finding(
            id="dominant-phase",
            title=f"{name} takes {entry.share:.0%} of the step ({PHASE_MEANING.get(name, name)})",
            saving_s=None,
            evidence={"phase": name, "phase_s": entry.seconds, "share": entry.share,
                      **step_evidence(ctx), "timeline": ctx.stats.timeline},
            confidence="high",
            kind="info",
            because=(f"{name}: {seconds(entry.seconds)} per step on {timeline_words(ctx)}, "
                     f"{pct(entry.share)} of the step"),
        )
    ]


def data_loading_exposed(ctx: Context) -> list[Finding]:
    """The device waits while the host loads the next batch.

    More DataLoader workers only help with free cores: the advice counts the cores free to this run
    over the measured steps (cores - other processes' busy CPU - this process's own), suggests at
    most one worker per free core, and none, with the reason, when no core is free."""
    total = step_s(ctx)
    exp = exposed_s(ctx, "data")
    if not total or exp / total < DATA_EXPOSED_MIN_SHARE:
        return []
    ev = {"data_exposed_s": exp, "share": exp / total, **step_evidence(ctx),
          "timeline": ctx.stats.timeline}
    note = ""
    confidence = "high" if on_cuda(ctx) else "medium"
    busy = _host_busy_during(ctx, "data")
    if busy is not None:
        ev["host_cpu_busy_during_data"] = busy
    if _own_cpu_during(ctx, "data") is not None:
        ev["own_cpu_cores_during_data"] = _own_cpu_during(ctx, "data")
    free = _free_cores(ctx)
    if free is not None:
        ev.update(free)
    if not on_cuda(ctx):
        note = ("on a CPU run the loader thread shares cores with the model's compute: the full "
                "saving needs the loading to be waiting (I/O, sleep) rather than computing")
        if busy is not None and busy > 0.9:
            confidence = "low"
            note = (f"the host was {busy:.0%} busy during data loading: a background loader would "
                    "compete with compute for the same cores; more cores (or a GPU) lift this")
            if free is not None and free["others_cpu_cores"] / free["cores"] >= OTHERS_NAMED_SHARE:
                note = (f"the host was {busy:.0%} busy during data loading, and other processes held "
                        f"{free['others_cpu_cores']:.1f} of {free['cores']} cores over the measured steps: "
                        "a background loader would compete with them and with compute for the same cores")
    saturated = busy is not None and busy > 0.9
    if mode(ctx) == "script" and ctx.sections.script.count("dataloader_next"):
        cheaper = ("make each sample cheaper to load (pre-tokenized uint16 files read with memmap, "
                   "no per-sample decoding)")
        if free is not None:
            workers = min(int(free["free_cores"]), MAX_WORKERS_SUGGESTED)
            ev["workers_suggested"] = workers
            if workers >= 1:
                fix = (f"DataLoader(num_workers={workers}, pin_memory=True, persistent_workers=True, "
                       f"prefetch_factor=2) so batches are prepared in worker processes while the model "
                       f"computes: {free['free_cores']:.1f} of {free['cores']} cores were free to this run "
                       "(one worker per free core at most)")
            else:
                fix = (f"{cheaper}; more DataLoader workers need idle cores, and none was free: of "
                       f"{free['cores']} cores, other processes held {free['others_cpu_cores']:.1f} and this "
                       f"process {free['proc_cpu_cores']:.1f} over the measured steps")
        elif saturated:
            # More workers need idle cores; there were none while data loaded.
            fix = f"{cheaper}; more DataLoader workers need idle cores, and there were none"
        else:
            fix = ("DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2) "
                   "so batches are prepared in worker processes while the model computes")
    else:
        call = ctx.sections.script.loader_call() if mode(ctx) == "script" else None
        fix = (f"prefetch batches in a background thread (a queue of 1-2 ready batches) so {call or 'get_batch'} "
               "overlaps forward/backward; on CUDA keep pin_memory + non_blocking copies")
        if free is not None and free["free_cores"] < 1:
            note = (note + "; " if note else "") + (
                f"a background loader needs a free core, and none was: of {free['cores']} cores, other "
                f"processes held {free['others_cpu_cores']:.1f} and this process {free['proc_cpu_cores']:.1f}")
    return [Finding(
        id="data-loading-exposed",
        title=f"the {'GPU' if on_cuda(ctx) else 'step'} waits {exp / total:.0%} of the step for data loading",
        saving_s=exp, evidence=ev, confidence=confidence, fix=fix,
        note=note, claims={"data": exp}, because=_data_because(ctx, exp, total, busy, free),
    )]


def _data_because(ctx: Context, exp: float, total: float, busy: float | None, free: dict | None) -> str:
    """data-loading-exposed's evidence in words: how long the device waits, how busy the host
    was while it loaded (waiting on I/O or computing), the free cores, and where in the user's
    code the data phase's samples fell."""
    if on_gpu_timeline(ctx):
        host = ctx.stats.phases["data"].host_seconds if "data" in ctx.stats.phases else None
        text = (f"the GPU sat idle {seconds(exp)} per step ({pct(exp / total)} of the step) while the host "
                "loaded the next batch")
        if host:
            text += f"; the loading itself took {seconds(host)} per step on the host"
    else:
        text = (f"data: {seconds(exp)} per step, {pct(exp / total)} of the step, on the host that also "
                "computes the model")
    own = _own_cpu_during(ctx, "data")
    if own is not None:
        # This run's CPU (its process and its workers) while it loaded: low means the loader
        # sleeps on I/O or a lock, high that it computes (decoding, copying, tokenizing).
        used = f"{pct(own, 0)} of one core" if own < 1 else f"{own:.1f} cores"
        text += f"; this run's CPU while it loaded was {used}"
        if own < 0.5:
            text += ": it waits, it does not compute"
        elif own >= 0.9:
            text += ": the loading computes, it does not wait"
        if busy is not None and busy > 0.9:
            text += f"; the machine's CPUs were {pct(busy, 0)} busy"
    elif busy is not None:
        text += f"; the machine's CPUs were {pct(busy, 0)} busy while it loaded"
    if free is not None:
        text += f"; {free['free_cores']:.1f} of {free['cores']} cores were free to this run"
    top = ctx.sections.script.top_function("data")
    if top is not None and top.function:
        func = "module level" if top.function == "<module>" else top.function
        text += (f"; in the script, {pct(top.share, 0)} of the data phase's stack samples were in "
                 f"{func} ({top.file}:{top.line})")
    return text


def _free_cores(ctx: Context) -> dict | None:
    """The cores free to this run over the measured steps (host sampler means, in cores):
    cores - other processes' busy CPU - this process's CPU (the training loop and torch's compute
    threads). This run's child processes (existing workers) are not subtracted: their loading is the
    work more workers would share. None when the profile does not have the split."""
    host = ctx.sections.host
    cores = host.cpu_count
    others = host.mean("others_cpu_cores")
    proc_pct = host.mean("proc_cpu_pct")
    if not cores or others is None or proc_pct is None:
        return None
    proc = proc_pct / 100.0
    children = host.mean("children_cpu_cores")
    return {"cores": cores, "others_cpu_cores": others, "proc_cpu_cores": proc,
            "children_cpu_cores": children, "free_cores": max(0.0, cores - others - proc)}


def _own_cpu_during(ctx: Context, phase: str) -> float | None:
    """This run's mean CPU, in cores (its process and child processes), while `phase` ran, or None."""
    val = ctx.sections.host.phase(phase, "own_cpu_cores")
    return float(val) if val is not None else None


def _host_busy_during(ctx: Context, phase: str) -> float | None:
    """Mean system-wide CPU busy fraction while `phase` ran (host sampler), or None."""
    val = ctx.sections.host.phase(phase, "cpu_pct")
    return float(val) / 100.0 if val is not None else None


def eval_in_measured_steps(ctx: Context) -> list[Finding]:
    """Evaluation runs inside the timed training step."""
    total = step_s(ctx)
    eval_s = ctx.seconds("eval")
    out = []
    if total and eval_s / total >= 0.02:
        out.append(Finding(
            id="eval-in-measured-steps",
            title=f"evaluation runs inside the training step: {eval_s / total:.0%} of every step",
            saving_s=eval_s,
            evidence={"eval_s": eval_s, "share": eval_s / total, **step_evidence(ctx)},
            confidence="high",
            because=(f"evaluation: {seconds(eval_s)} per step, {pct(eval_s / total)} of the step, inside "
                     "the timed training step"),
            fix=("evaluate every eval_interval steps (not every step), outside the timed window, "
                 "with fewer eval_iters"),
            claims={"eval": eval_s},
        ))
    script = ctx.sections.script
    first = script.reported.first_step_ms
    median = script.reported.step_ms_median
    if not out and first and median and first > 3 * median and script.eval_forwards:
        out.append(Finding(
            id="eval-in-measured-steps",
            title=(f"the script's own time for its first iteration ({first:,.0f} ms) includes "
                   f"evaluation: {first / median:.0f}x its median step"),
            saving_s=None,
            evidence={"first_step_ms": first, "step_ms_median": median,
                      "eval_forwards": script.eval_forwards},
            confidence="medium", kind="info",
            note="the script's printed first-iteration time is not a training step time",
            because=(f"the script printed {seconds(first / 1e3)} for its first iteration and "
                     f"{seconds(median / 1e3)} for its median one ({times(first / median)}); "
                     f"{script.eval_forwards} evaluation forward passes ran in the profiled steps"),
        ))
    return out


def compute_bound(ctx: Context) -> list[Finding]:
    """A verdict: the step is model compute; data/IO fixes will not help."""
    total = step_s(ctx)
    if not total:
        return []
    non_compute = sum(exposed_s(ctx, p) for p in ("data", "h2d", "other", "eval"))
    share = non_compute / total
    # a sharded model's collectives (and the waiting for peers in them) are not compute either
    if share > COMPUTE_BOUND_MAX_EXPOSED or ctx.share("comm") > COMPUTE_BOUND_MAX_EXPOSED:
        return []
    compute_share = sum(ctx.share(p) for p in COMPUTE_PHASES)
    compute_s = sum(ctx.seconds(p) for p in COMPUTE_PHASES)
    ev = {"compute_share": compute_share, "non_compute_exposed_share": share, **step_evidence(ctx)}
    title = f"compute-bound: forward, backward and optimizer are {compute_share:.1%} of the step"
    because = (f"forward, backward and optimizer: {seconds(compute_s)} per step, {pct(compute_share)} of "
               f"the step; data loading, copies and other loop code "
               + ("leave the GPU waiting" if on_cuda(ctx) else "take")
               + f" {seconds(non_compute)} per step ({pct(share)})")
    mfu = ctx.mfu if ctx.mfu is not None else MfuResult()
    floor = mfu.floor_s
    shown = total
    if floor:
        # The step over its floor as the MFU section states it: the typical step (the one printed).
        ratio = mfu.step_over_floor or shown / floor
        ev["floor_s"] = floor
        ev["times_floor"] = ratio
        title += f"; the step is {ratio:.1f}x its FLOP floor ({seconds(floor)})"
        because += (f"; the {seconds(shown)} step is {times(ratio)} its FLOP floor of {seconds(floor)} "
                    "at 100% of the peak")
    if mfu.mfu is not None:
        ev["mfu"] = mfu.mfu
    if mfu.mfu_vs_ceiling is not None:
        ev["mfu_vs_ceiling"] = mfu.mfu_vs_ceiling
    if mfu.mfu is not None:
        because += f"; MFU {pct(mfu.mfu)} of the datasheet peak"
    if mfu.mfu_vs_ceiling is not None:
        because += f"; MFU {pct(mfu.mfu_vs_ceiling)} of the measured matmul ceiling"
    return [Finding(
        id="compute-bound", title=title, saving_s=None, evidence=ev,
        confidence="high", kind="verdict", because=because,
        note=("data loading, storage and copies are not what limits this step: moving data to "
              "faster storage or adding loader workers will not make it faster; only faster "
              "math (dtype, compile, kernels) or fewer FLOPs will"),
    )]
