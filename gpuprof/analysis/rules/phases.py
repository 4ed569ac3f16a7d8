"""Rules about how the step's time splits into phases."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import COMPUTE_PHASES, exposed_s, mode, on_cuda, step_s

PHASE_MEANING = {
    "data": "loading batches on the host",
    "h2d": "copying batches to the device",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "clipping, the optimizer step and zero_grad",
    "other": "loop code outside the measured phases",
    "eval": "evaluation inside the training step",
}

DATA_EXPOSED_MIN_SHARE = 0.05  # torch-tb-profiler's DataLoader threshold
COMPUTE_BOUND_MAX_EXPOSED = 0.10


def dominant_phase(ctx: Context) -> list[Finding]:
    """Names the phase that takes the largest share of the step (information, not a fix)."""
    phases = ctx.summary.get("phases") or {}
    if not phases:
        return []
    name, entry = max(phases.items(), key=lambda kv: kv[1].get("seconds", 0.0))
    return [
        Finding(
            id="dominant-phase",
            title=f"{name} takes {entry['share']:.0%} of the step ({PHASE_MEANING.get(name, name)})",
            saving_s=None,
            saving_share=None,
            evidence={"phase": name, "phase_s": entry["seconds"], "share": entry["share"],
                      "step_s": step_s(ctx), "timeline": ctx.summary.get("timeline")},
            confidence="high",
            kind="info",
        )
    ]


def data_loading_exposed(ctx: Context) -> list[Finding]:
    """The device waits while the host loads the next batch."""
    total = step_s(ctx)
    exp = exposed_s(ctx, "data")
    if not total or exp / total < DATA_EXPOSED_MIN_SHARE:
        return []
    ev = {"data_exposed_s": exp, "share": exp / total, "step_s": total,
          "timeline": ctx.summary.get("timeline")}
    note = ""
    confidence = "high" if on_cuda(ctx) else "medium"
    busy = _host_busy_during(ctx, "data")
    if busy is not None:
        ev["host_cpu_busy_during_data"] = busy
    if not on_cuda(ctx):
        note = ("on a CPU run the loader thread shares cores with the model's compute: the full "
                "saving needs the loading to be waiting (I/O, sleep) rather than computing")
        if busy is not None and busy > 0.9:
            confidence = "low"
            note = (f"the host was {busy:.0%} busy during data loading: a background loader would "
                    "compete with compute for the same cores; more cores (or a GPU) lift this")
    saturated = busy is not None and busy > 0.9
    counts = ((ctx.profile.measurements.get("script") or {}).get("hooks") or {}).get("counts") or {}
    if mode(ctx) == "script" and counts.get("dataloader_next"):
        if saturated:
            # More workers need idle cores; there were none while data loaded.
            fix = ("make each sample cheaper to load (pre-tokenized uint16 files read with memmap, "
                   "no per-sample decoding); more DataLoader workers need idle cores, and there were none")
        else:
            fix = ("DataLoader(num_workers=N, pin_memory=True, persistent_workers=True, prefetch_factor=2) "
                   "so batches are prepared in worker processes while the model computes")
    else:
        fix = ("prefetch batches in a background thread (a queue of 1-2 ready batches) so get_batch "
               "overlaps forward/backward; on CUDA keep pin_memory + non_blocking copies")
    return [Finding(
        id="data-loading-exposed",
        title=f"the {'GPU' if on_cuda(ctx) else 'step'} waits {exp / total:.0%} of the step for data loading",
        saving_s=exp, saving_share=exp / total, evidence=ev, confidence=confidence, fix=fix,
        note=note, claims={"data": exp},
    )]


def _host_busy_during(ctx: Context, phase: str) -> float | None:
    """Mean system-wide CPU busy fraction while `phase` ran (host sampler), or None."""
    host = ctx.profile.measurements.get("host") or {}
    entry = (host.get("phases") or {}).get(phase) or {}
    val = entry.get("cpu_pct")
    return float(val) / 100.0 if val is not None and entry.get("samples") else None


def eval_in_measured_steps(ctx: Context) -> list[Finding]:
    """Evaluation runs inside the timed training step."""
    total = step_s(ctx)
    eval_s = ctx.summary.get("phases", {}).get("eval", {}).get("seconds", 0.0)
    out = []
    if total and eval_s / total >= 0.02:
        out.append(Finding(
            id="eval-in-measured-steps",
            title=f"evaluation runs inside the training step: {eval_s / total:.0%} of every step",
            saving_s=eval_s, saving_share=eval_s / total,
            evidence={"eval_s": eval_s, "share": eval_s / total, "step_s": total},
            confidence="high",
            fix=("evaluate every eval_interval steps (not every step), outside the timed window, "
                 "with fewer eval_iters"),
            claims={"eval": eval_s},
        ))
    script = ctx.profile.measurements.get("script") or {}
    first = (script.get("reported") or {}).get("first_step_ms")
    median = (script.get("reported") or {}).get("step_ms_median")
    if not out and first and median and first > 3 * median and script.get("eval_forwards"):
        out.append(Finding(
            id="eval-in-measured-steps",
            title=(f"the script's own time for its first iteration ({first:,.0f} ms) includes "
                   f"evaluation: {first / median:.0f}x its median step"),
            saving_s=None, saving_share=None,
            evidence={"first_step_ms": first, "step_ms_median": median,
                      "eval_forwards": script.get("eval_forwards")},
            confidence="medium", kind="info",
            note="the script's printed first-iteration time is not a training step time",
        ))
    return out


def compute_bound(ctx: Context) -> list[Finding]:
    """A verdict: the step is model compute; data/IO fixes will not help."""
    total = step_s(ctx)
    if not total:
        return []
    non_compute = sum(exposed_s(ctx, p) for p in ("data", "h2d", "other", "eval"))
    share = non_compute / total
    if share > COMPUTE_BOUND_MAX_EXPOSED:
        return []
    compute_share = sum(ctx.share(p) for p in COMPUTE_PHASES)
    ev = {"compute_share": compute_share, "non_compute_exposed_share": share, "step_s": total}
    title = f"compute-bound: forward, backward and optimizer are {compute_share:.1%} of the step"
    mfu = ctx.mfu or {}
    floor = mfu.get("floor_s")
    if floor:
        ev["floor_s"] = floor
        ev["times_floor"] = total / floor
        title += f"; the step is {total / floor:.1f}x its FLOP floor ({floor:.3g} s)"
    for key in ("mfu", "mfu_vs_ceiling"):
        if mfu.get(key) is not None:
            ev[key] = mfu[key]
    return [Finding(
        id="compute-bound", title=title, saving_s=None, saving_share=None, evidence=ev,
        confidence="high", kind="verdict",
        note=("data loading, storage and copies are not what limits this step: moving data to "
              "faster storage or adding loader workers will not make it faster; only faster "
              "math (dtype, compile, kernels) or fewer FLOPs will"),
    )]
