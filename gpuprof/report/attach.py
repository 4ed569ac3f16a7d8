"""What the report says about an attached run (`gpuprof attach`): how it was sampled, the
process, and what its host samples and the GPU's utilization say together. The profile stores
the figures (measurements.attach: the phase shares, the sampler, the process; measurements.nvml:
the GPU's utilization); the judgement and its words are made here, from them. Words of
gpuprof.report.words, kept apart for size."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import Profile
from gpuprof.units import NM, UNKNOWN, count, pct, seconds

# From outside, host-to-device copies cannot be told apart: worded once, for every attached run.
H2D_NOTE = ("host-to-device copies are C calls, invisible in Python stacks: their time counts where they are "
            "called from (usually data)")
EXACT = "`gpuprof diagnose` on the next restart measures the GPU timeline exactly (CUDA events)"
BUSY_PCT = 90.0  # GPU utilization at or above which the GPU, not the host, sets the pace

# GpuInference.reading
NO_READING = "no-gpu-reading"  # NVML did not see the process on a GPU
NO_UTILIZATION = "utilization-unreadable"
GPU_PACES = "gpu-sets-the-pace"  # utilization ≥ BUSY_PCT: the host's data time hides behind GPU work
GPU_WAITS = "gpu-waits-for-the-host"


@dataclass(frozen=True)
class GpuInference:
    """What host samples and GPU utilization together say about an attached run: `reading` (one
    of the constants above), the figures it rests on, and `text` for an older profile that
    stored its sentence (measurements.attach.gpu_inference)."""

    reading: str | None
    util_pct: float | None = None  # the GPU's mean utilization over the window (NVML)
    data_share: float | None = None  # the host's sampled share in data
    text: str | None = None


def gpu_inference(profile: Profile) -> GpuInference:
    """The GPU inference of an attached run, from its figures."""
    a = profile.measurements.get("attach") or {}
    if isinstance(a.get("gpu_inference"), str) and a["gpu_inference"]:
        return GpuInference(None, text=a["gpu_inference"])
    nvml = profile.sections.nvml
    data = ((a.get("shares") or {}).get("data") or {}).get("share")
    data = float(data) if isinstance(data, (int, float)) else 0.0
    if not nvml.available:
        return GpuInference(NO_READING, data_share=data)
    util = nvml.mean("gpu_util_pct")
    if util is None:
        return GpuInference(NO_UTILIZATION, data_share=data)
    return GpuInference(GPU_PACES if util >= BUSY_PCT else GPU_WAITS, util_pct=util, data_share=data)


def gpu_inference_text(g: GpuInference) -> str:
    """The inference in words, and what would make it exact."""
    if g.text:
        return g.text
    if g.reading == NO_READING:
        return ("no GPU reading: host samples alone cannot tell 'the GPU is busy and the host waits' from "
                f"'the GPU starves'; {EXACT}")
    if g.reading == NO_UTILIZATION:
        return f"GPU utilization not readable; {EXACT}"
    data = pct(g.data_share or 0.0, 0)
    if g.reading == GPU_PACES:
        return (f"GPU busy {g.util_pct:.0f}% of the time: the host's {data} in data is hidden behind GPU work "
                f"(the GPU, not data, sets the pace); {EXACT}")
    return (f"GPU busy only {g.util_pct:.0f}% of the time while the host spends {data} in data: the GPU waits "
            f"for the host; {EXACT}")


def attach_rows(profile: Profile) -> list[tuple[str, str]]:
    """What an attached run's report says about how it was measured: the process, the sampling,
    the process's CPU, workers and reads, host-to-device copies, the GPU inference."""
    run = profile.run
    a = profile.measurements.get("attach") or {}
    smp, steps, proc = a.get("sampler") or {}, a.get("steps") or {}, a.get("process") or {}
    rows = [("attached", f"process {run.get('pid')}: " + (" ".join(str(c) for c in run.get("command") or []) or NM))]
    if run.get("target_ended_at_s") is not None:
        rows.append(("ended", f"the target ended {run['target_ended_at_s']:.1f} s into the window: what was "
                              "sampled is reported"))
    split = (f"; {steps['gaps_split']} gap{'s' if steps['gaps_split'] != 1 else ''} between seen boundaries "
             f"held several steps and were split evenly" if steps.get("gaps_split") else "")
    seen = (f"{steps.get('boundaries', steps.get('optimizer_ends', 0))} step boundaries seen "
            f"({steps.get('boundary_source') or 'the optimizer step'})")
    rows.append(("sampled", f"py-spy {smp.get('version') or ''} at {smp.get('rate_hz')}/s"
                 f"{' (non-blocking)' if smp.get('nonblocking') else ''}: {smp.get('samples') or NM} samples"
                 + (f" of {smp['expected_samples']} due" if smp.get("expected_samples") else "")
                 + f", {seconds(smp.get('sampled_s'))} of the training thread; {steps.get('steps', 0)} steps from "
                 f"{seen}{split}; {steps.get('typical_micro_steps')} micro-steps per step, "
                 f"{steps.get('unit_source') or NM} (--grad-accum N sets it)"))
    q = smp.get("quality") or {}
    if q.get("ticks"):
        late = q.get("late_ms") or {}
        busy = q.get("host_busy_cores")
        rows.append(("sampling", f"a tick of the sampler's rate came {late.get('p95') or 0:.1f} ms late at p95 "
                     f"(max {late.get('max') or 0:.1f} ms; {pct(q.get('late_share') or 0.0)} more than a period late: "
                     f"the shares' interval is widened by that)"
                     + (f"; the host's CPU {busy:.2f} of {q.get('host_cores')} cores busy" if busy is not None else "")
                     + (f"; py-spy fell behind {smp['behind_warnings']}× (up to {smp.get('behind_max_s')} s)"
                        if smp.get("behind_warnings") else "")))
    cores = proc.get("cpu_cores")
    kids = proc.get("children") or []
    line = f"{cores:.2f} cores" if cores is not None else "CPU not measured"
    if kids:
        line += f"; {len(kids)} worker process{'es' if len(kids) != 1 else ''} (" + ", ".join(
            f"{pct(k['cpu_share_of_a_core'] or 0, 0)} of a core" for k in kids[:4]) + ")"
    rb, rc = proc.get("read_bytes_s"), proc.get("read_chars_s")
    if rb is not None:
        line += f"; reads {count(rb)}B/s from storage, {count(rc or 0)}B/s through read() (page cache included)"
    rows.append(("process", line))
    cost = cost_text(proc.get("cost"))
    if cost:
        rows.append(("its cost", cost))
    for f in (proc.get("files") or [])[:2]:
        cache = f.get("page_cache_share")
        rows.append(("file", f"{f['path']} ({count(f['size_bytes'])}B, {f.get('fs_type', UNKNOWN)} {f.get('fs_kind', '')}"
                     + (f", {pct(cache, 0)} in the page cache" if cache is not None else "")
                     + f"): `gpuprof bench-disk {f['path']}` tells what this storage delivers)"))
    rows.append(("h2d", H2D_NOTE))
    rows.append(("GPU", gpu_inference_text(gpu_inference(profile))))
    return rows


def cost_text(cost: dict | None) -> str | None:
    """What attaching cost the target, in words, from its threads' waits for a CPU before and while
    sampled (gpuprof.attach.cost); None for an older profile."""
    if not isinstance(cost, dict):
        return None
    if cost.get("not_measured"):
        return f"attach's cost on the target not measured: {cost['not_measured']}"
    before, during, added = cost.get("before") or {}, cost.get("during") or {}, cost.get("added_wait_s_per_s")
    if added is None:
        return None
    prio = cost.get("gpuprof_priority") or {}
    how = ""
    if prio.get("gentle") is True:
        how = "; gpuprof's own work ran at the lowest priority, on idle CPU"
    elif prio.get("gentle") is False and prio.get("idle_cores") is not None:
        how = (f"; gpuprof kept its priority: the host had {prio['idle_cores']:.2f} idle cores as it started, "
               "so its own CPU was taken from the target")
    return (f"its threads waited for a CPU {during.get('wait_s_per_s', 0) * 1e3:.0f} ms per second while sampled, "
            f"{before.get('wait_s_per_s', 0) * 1e3:.0f} ms per second in the {before.get('seconds', 0):.0f} s before "
            f"(/proc schedstat): attaching cost it at most {pct(added, 1)} of its time{how}")


def inferred_steps_note(profile: Profile) -> str | None:
    """An attached run's steps where most of them were not seen but inferred: the step loop's
    once-per-step code was sampled at few boundaries, so gaps holding several steps were split by
    the micro-steps per step, and where that unit is uncertain the step is too (a micro-step whose
    compute lasts about one sampling period goes unseen: 229 ms read for a 129-ms step,
    docs/measurements/2026-12-08-attach-cost.md). None where most steps lay between boundaries seen
    and the unit is given or sure."""
    from gpuprof.attach.phases import UNIT_SURE

    steps = (profile.measurements.get("attach") or {}).get("steps") or {}
    n, gaps, split = steps.get("steps"), steps.get("gaps"), steps.get("gaps_split") or 0
    if not isinstance(n, int) or not isinstance(gaps, int) or n <= 0:
        return None
    margin = steps.get("unit_margin")
    uncertain = isinstance(margin, (int, float)) and margin < UNIT_SURE
    inferred = n - (gaps - split)  # the steps that came out of gaps split evenly
    if not uncertain and inferred * 2 <= n:
        return None
    seen = steps.get("boundaries", 0)
    text = (f"an estimate: {inferred} of the {n} steps inferred from gaps between the {seen} step boundaries seen"
            if inferred > 0 else f"an estimate: each gap between the {seen} step boundaries seen counted as one step")
    if uncertain:
        text += (f", by a micro-steps-per-step figure ({steps.get('typical_micro_steps')}) that is uncertain: "
                 "`--grad-accum N` sets it")
    return text
