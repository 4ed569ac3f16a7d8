"""Rules from what the samplers saw and what the script claimed: MFU, throttling, CPU load."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.mfu import NANOGPT_A100_TFLOPS
from gpuprof.analysis.mfu_results import AGREES, CANNOT_CHECK
from gpuprof.analysis.rules.common import COMPUTE_PHASES, on_cuda
from gpuprof.sections import HostSection
from gpuprof.units import flops_rate, join_notes, pct, seconds

CPU_SATURATED = 0.90
OTHERS_NOTABLE_SHARE = 0.20  # other processes' share of the cores worth naming even when this run leads
THROTTLE_SHARE_MIN = 0.20
# NVML clock-event reasons that mean the GPU slowed itself: heat, the hardware slowdown signal, the
# external power brake. Not sw_power_cap: a busy datacenter GPU runs at its power limit, below max
# boost, by design; and not gpu_idle or application clocks.
SLOWDOWN_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown")


# Where a reported MFU came from: (the noun of the title, the opening of the `because`).
MFU_SOURCES = {"script output": ("printed", "the script printed"),
               "log": ("printed", "the log prints"),
               "--reported-mfu": ("reported", "the MFU given with --reported-mfu is")}


def misreport_finding(reported_pct: float, true_mfu: float | None, peak_tflops: float | None,
                      dtype: str | None, source: str | None, *, reasons: tuple, gpu: str | None,
                      flops_per_step: float | None, step_s: float | None, step_words: str,
                      evidence: dict) -> list[Finding]:
    """The `mfu-misreported` correction, worded once for a measured run and a log alike: the
    reported MFU (in %) against the true one (a fraction, on `peak_tflops` in `dtype`), with the
    causes analysis.mfu.explain_misreport found (`reasons`). `source` says where the figure came
    from (MFU_SOURCES), `step_words` which step time the true MFU divides by ("measured",
    "median"), `evidence` the keys the rule adds to reported_pct, true_pct and peak_tflops.
    [] when the causes show nothing wrong (the figures agree, or a figure up to 100% cannot be
    checked)."""
    causes = {r.cause for r in reasons}
    if not reasons or causes <= {AGREES} or (causes <= {CANNOT_CHECK} and reported_pct <= 100):
        return []
    noun, opening = MFU_SOURCES.get(source, ("reported", "the reported MFU is"))
    title = f"the {noun} MFU {reported_pct:.1f}% is wrong"
    if true_mfu is not None:
        title += f": the true MFU is {true_mfu * 100:.1f}%"
    if reported_pct > 100:
        title += " (above 100% is impossible)"
    because = f"{opening} {reported_pct:.1f}%"
    peak_words = f"{dtype} peak" if dtype else "peak"
    if true_mfu is not None and peak_tflops:
        because += (f"; this step's {flops_per_step:.3g} FLOPs in its {step_words} {seconds(step_s)} "
                    f"against the {peak_words} of {gpu or 'this device'} ({flops_rate(peak_tflops)}) "
                    f"give {true_mfu * 100:.1f}%") if flops_per_step else f"; the true MFU is {true_mfu * 100:.1f}%"
    else:
        because += "; there is no true MFU to compare it with (no datasheet peak or no FLOP count)"
    if peak_tflops:
        fix = (f"compute MFU against this GPU's {peak_words} "
               f"(flops_promised = {peak_tflops:g}e12 in nanoGPT's estimate_mfu")
        if any(c.startswith("a100_constant") for c in causes):
            fix += f", not the A100's {NANOGPT_A100_TFLOPS:g}e12"
        fix += ")"
    else:
        fix = "compute MFU against this GPU's datasheet peak"
    ev = {"reported_pct": reported_pct, "true_pct": true_mfu * 100 if true_mfu is not None else None,
          "peak_tflops": peak_tflops, **evidence}
    return [Finding(
        id="mfu-misreported", title=title, saving_s=None, kind="correction", evidence=ev,
        confidence="high" if true_mfu is not None else "medium", fix=fix,
        note=join_notes(*(r.text for r in reasons if r.cause != AGREES)), because=because,
    )]


def mfu_misreported(ctx: Context) -> list[Finding]:
    """The MFU a script printed (or the user quoted) uses the wrong peak or is impossible."""
    mfu = ctx.mfu
    if mfu is None or mfu.reported_mfu_pct is None or not mfu.misreport:
        return []
    return misreport_finding(
        mfu.reported_mfu_pct, mfu.mfu, mfu.peak_tflops, mfu.dtype, mfu.reported_source,
        reasons=mfu.misreport, gpu=mfu.device_label, flops_per_step=mfu.flops_per_step,
        step_s=mfu.step_s, step_words="measured",
        evidence={"source": mfu.reported_source, "causes": ", ".join(r.cause for r in mfu.misreport)})


def gpu_throttled(ctx: Context) -> list[Finding]:
    """NVML reported that the GPU slowed itself: a thermal (sw/hw_thermal_slowdown), hardware
    (hw_slowdown) or power-brake (hw_power_brake_slowdown) clock-event reason in at least
    THROTTLE_SHARE_MIN of the measured samples.

    An SM clock below max boost, or running at the power limit (sw_power_cap), never fires it on
    its own: both are normal for a busy datacenter GPU; the power-cap share is only evidence. The
    saving, compute time x (1 - SM clock share while computing), is given only with a slowdown
    reason, and is an upper bound: without the slowdown the clock would still sit under max boost
    at the power limit, and memory-bound kernels do not speed up with the SM clock."""
    nvml = ctx.sections.nvml
    if not nvml.available:
        return []
    slow = {r: nvml.throttle(r) for r in SLOWDOWN_REASONS if (nvml.throttle(r) or 0) >= THROTTLE_SHARE_MIN}
    if not slow:
        return []
    # The SM clock's share of its maximum while each compute phase ran (as stored: a phase of an
    # older or hand-made section may not keep its sample count).
    clocks = [nvml.phases[p].figure("sm_clock_share") for p in COMPUTE_PHASES if p in nvml.phases]
    shares = [c for c in clocks if c is not None]
    clock = min(shares) if shares else None
    phase_s = {p: ctx.seconds(p) for p in COMPUTE_PHASES}
    compute = sum(phase_s.values())
    lost = 1 - clock if clock is not None and clock < 1 else None
    saving = compute * lost if lost else None
    power_cap = nvml.throttle("sw_power_cap")
    if saving:
        note = ("upper bound: assumes compute time scales with the SM clock up to max boost; at its power "
                "limit the GPU would stay below max boost, and memory-bound kernels gain less")
    elif clock is None:
        note = "not estimated: no SM clock was read while computing"
    else:
        note = "not estimated: the SM clock stayed at max boost while computing"
    if power_cap:
        note += f"; it also ran at its power limit in {power_cap:.0%} of samples, which is normal under load"
    because = "NVML reported " + ", ".join(f"{r} in {pct(s, 0)} of the samples" for r, s in slow.items())
    if clock is not None:
        because += f"; while computing, the SM clock ran at {pct(clock, 0)} of its maximum"
    because += f"; forward, backward and optimizer take {seconds(compute)} per step"
    return [Finding(
        id="gpu-throttled",
        title="the GPU slowed itself: " + ", ".join(f"{r} {s:.0%} of samples" for r, s in slow.items()),
        saving_s=saving,
        evidence={"slowdown_share": slow, "throttle_share": nvml.throttle_share, "power_cap_share": power_cap,
                  "sm_clock_share_compute": clock, "compute_s": compute},
        confidence="medium",
        fix=("check cooling and power delivery: nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER names the "
             "active reason; thermal slowdown means airflow or inlet temperature, hw_slowdown or the "
             "power brake an external signal from the board or the power supply"),
        note=note, because=because,
        claims={p: s * lost for p, s in phase_s.items() if s} if saving else {},
    )]


def cpu_saturated(ctx: Context) -> list[Finding]:
    """Every core was busy during the measured steps: host work cannot overlap and the host is the
    limit. Who held the cores decides the fix: this run (its process and child processes, e.g.
    DataLoader workers) or other processes on the machine. A profile from before the host sampler
    split the two gets the machine-wide reading only."""
    host = ctx.sections.host
    mean = host.mean("cpu_pct")
    if mean is None or mean / 100.0 < CPU_SATURATED:
        return []
    cores = host.cpu_count
    ev = {"cpu_busy_mean": mean / 100.0, "cores": cores}
    split = _cpu_split(host)
    kind = "info" if not on_cuda(ctx) else "fix"
    title = f"the host's CPUs were {mean:.0f}% busy on average"
    own = others = 0.0
    because = (f"the host's {cores} cores were {mean:.0f}% busy on average over the measured steps" if cores
               else f"the host's CPUs were {mean:.0f}% busy on average over the measured steps")
    if split is not None:
        busy, own, others = split
        ev.update({"machine_busy_cores": busy, "own_cpu_cores": own, "others_cpu_cores": others,
                   "own_share": own / cores, "others_share": others / cores,
                   "own_includes": "this process and its child processes (e.g. DataLoader workers)"})
        because += (f"; this run (its process and child processes) used {own:.1f} cores, other processes "
                    f"{others:.1f}")
    if split is not None and others >= own:
        # Mostly other processes: the model's compute is not what fills the cores.
        title = (f"the host's CPUs were {mean:.0f}% busy: other processes held {others:.1f} of {cores} "
                 f"cores ({others / cores:.0%}) during the measured steps; this run used {own:.1f}")
        fix = ("free the cores: find the other processes (top, or ps -eo pid,pcpu,comm --sort=-pcpu | head) "
               "and stop or pause them; if they must run, pin this run and them to separate cores "
               "(taskset -c, with torch.set_num_threads set to this run's cores)")
        note = ("until the cores are free, expect slower and noisy step times: this run's phase times were "
                "measured while competing for the CPU, so they are not what this machine gives an idle run")
        if on_cuda(ctx):
            note += "; on a GPU run a contended host delays kernel launches and data loading"
        # Information on a CPU run, as below: it says what the measurement competed with and ranks
        # after the verdict on the step itself; on a GPU run a starved host is a fix.
        return [Finding(id="cpu-saturated", title=title, saving_s=None, evidence=ev,
                        confidence="medium", kind=kind, fix=fix, note=note, because=because)]
    if split is not None:
        title = f"the host's CPUs were {mean:.0f}% busy: this run used {own:.1f} of {cores} cores"
        if others / cores >= OTHERS_NOTABLE_SHARE:
            title += f"; other processes held {others:.1f} ({others / cores:.0%})"
    if on_cuda(ctx):
        fix = "free the host: fewer loader workers or threads elsewhere, torch.set_num_threads for the main process"
        note = "on a GPU run a saturated host delays kernel launches and data loading"
    else:
        fix = "on a CPU run the model's compute uses every core: only more cores or a GPU make it faster"
        note = "background loaders and extra workers would compete with compute for the same cores"
    if split is not None and others / cores >= OTHERS_NOTABLE_SHARE:
        note += (f"; other processes held {others:.1f} of the {cores} cores, which this run could use "
                 "once they are stopped")
    return [Finding(
        id="cpu-saturated", title=title,
        saving_s=None, evidence=ev, confidence="medium",
        kind=kind, fix=fix, note=note, because=because,
    )]


def _cpu_split(host: HostSection) -> tuple[float, float, float] | None:
    """(machine busy, this run's, other processes') CPU in cores over the measured steps, or None
    when the profile does not have them."""
    vals = [host.mean(k) for k in ("cpu_busy_cores", "own_cpu_cores", "others_cpu_cores")]
    if any(v is None for v in vals) or not host.cpu_count:
        return None
    return vals[0], vals[1], vals[2]
