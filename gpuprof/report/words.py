"""Every sentence the report says about a run, worded once: the terminal, the HTML page and
`compare` print these strings and never word a figure themselves. Figures in words come from
gpuprof.units; this module turns a Profile and its Analysis into the sentences."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.analysis.distributed_results import MergedView
from gpuprof.analysis.findings import Finding
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.profile import Profile
from gpuprof.report.attach import attach_rows
from gpuprof.sections import PrecisionSection, Sections
from gpuprof.sections.script import STEP_BACKWARD, STEP_OPTIMIZER, STEP_ZERO_GRAD
from gpuprof.stats import PHASES, StepStats
from gpuprof.units import (NA, NM, UNKNOWN, count, evidence_words, flops_rate, interval_text, pct, pct_range, seconds,
                           tokens)

NOT_ESTIMATED = "not estimated (the note says why)"
TYPICAL_NOTE = ("The typical step is the mean of the measured steps that are not irregular (far slower "
                "than the median: a pause); the phase table adds up to it, and every fix's saving is a "
                "share of it. What the irregular steps cost is said on its own.")



@dataclass(frozen=True)
class Headings:
    """Every heading and label the reports show, decided once: the terminal and the HTML page
    lay them out and word none of their own."""

    verdict: str = "Verdict:"
    irregular: str = "Irregular steps (not in the typical step)"
    fixes: str = "Fixes, ranked by the time they save per step"
    no_fixes: str = "Fixes: none found in this run"
    corrections: str = "Corrections (a wrong figure, not time)"
    infos: str = "Also found"
    corrected: str = "Corrected config (write it with --write FILE)"
    corrected_short: str = "Corrected config"
    flags: str = "flags:"
    what_ran: str = "What ran"
    details: str = "Details"
    details_hint: str = "more with --details: the MFU table, the GPU and host samplers, user-code attribution"
    no_steps: str = "no complete measured step: nothing to report"
    no_correction: str = "no finding of this run is a config fix: nothing to correct"
    step: str = "step"
    noise: str = "noise:"
    mfu: str = "MFU"
    finding_fields: tuple = ("saves", "change", "because", "note")
    phase_columns: tuple = ("phase", "per step", "share")
    gpu_columns: tuple = ("host time", "GPU idle")
    total: str = "total"
    # the HTML page's sections, in order
    findings_section: str = "Verdict and ranked fixes"
    phases_section: str = "Phase breakdown"
    steps_section: str = "Step times over the run"
    gpu_section: str = "GPU utilization and memory"
    host_section: str = "Host CPU"
    ranks_section: str = "Ranks"
    notes_section: str = "Not measured, and where the time went in the script"
    page_footer: str = ("gpuprof {version}, profile schema {schema}. Every figure on this page is from the profile; "
                        "\u201c{nm}\u201d where the run did not measure it.")


HEADINGS = Headings()

def timeline_name(stats: StepStats | None) -> str:
    return "GPU timeline" if stats is not None and stats.timeline == "gpu" else "host wall time"


# ------------------------------------------------------------------------------------ findings
def saving_text(f: Finding) -> str | None:
    """What a finding saves per step, in words (None for a verdict, an irregular-steps finding or
    information: they save no per-step time of their own), with the interval its paired rounds
    give (evidence saving_low_s/saving_high_s/interval_level/rounds) and the fixes it is tied
    with: "31.0 ms per step (18.0–41.0 ms, 93%, 8 rounds; 15.2% of the typical step, 8.8–20.1%)". A timed
    change whose interval holds no change: none claimed, within this machine's noise."""
    ev = f.evidence or {}
    timed = "saving_low_s" in ev and "saving_high_s" in ev
    unit = "pairs of your loop's steps" if ev.get("measured_on") == "your loop" else "rounds"
    interval = interval_text(ev["saving_low_s"], ev["saving_high_s"], ev.get("interval_level") or 0.0,
                             ev.get("rounds"), unit) if timed else ""
    if timed and ev.get("within_noise") and f.saving_s is None:
        return f"none claimed: within this machine's noise ({interval})"
    if f.kind == "correction":
        return "no time: it corrects a figure"
    if f.kind != "fix":
        return None
    if f.saving_s is None:
        if ev.get("ceiling_s"):  # what ranks it: the most its phases could give
            return f"{NOT_ESTIMATED}; at most {seconds(ev['ceiling_s'])} per step ({ev.get('ceiling_what') or 'its ceiling'})"
        return NOT_ESTIMATED
    if f.saving_s <= 1e-9 and f.overlaps:  # its whole interval is another fix's saving
        return f"nothing more: its time is already counted in {', '.join(f.overlaps)}"
    share = pct(f.saving_share)
    if timed and f.saving_share and f.saving_s:  # the interval as shares of the same typical step
        per = f.saving_share / f.saving_s
        share += f" of the typical step, {pct_range(ev['saving_low_s'] * per, ev['saving_high_s'] * per)}"
    else:
        share += " of the typical step"
    text = f"{seconds(f.saving_s)} per step ({interval + '; ' if timed else ''}{share})"
    if f.tied_with:
        text += f"; tied with {', '.join(f.tied_with)} within noise"
    return text


def because_text(f: Finding) -> str:
    """The evidence in words: the rule's own sentence, else the evidence dict worded generically."""
    return f.because or evidence_words(f.evidence or {})


# -------------------------------------------------------------------------------- the headline
def run_line(profile: Profile) -> str:
    """What ran, in one line: the model and the device."""
    cfg = profile.config
    env = profile.environment
    mode = profile.run.get("mode")
    model = cfg.get("model") or {"script": "a script", "attach": "a running process"}.get(mode, "a model")
    if cfg.get("param_count"):
        model += f" ({count(cfg['param_count'])} parameters)"
    return f"{model} on {env.get('device_name') or cfg.get('device') or NM}"


def step_statistic(stats: StepStats) -> str:
    """How the headline step was obtained, and the spread of all steps."""
    spread = (f"median {seconds(stats.median_s)}, p10 {seconds(stats.p10_s)}, p90 {seconds(stats.p90_s)}, "
              f"spread {pct(stats.spread, 0)}")
    n = stats.n_steps
    if stats.irregular:
        k = len(stats.irregular)
        return (f"typical: the mean of {len(stats.typical)} of {n} measured steps, {timeline_name(stats)}; "
                f"{k} irregular step{'s' if k != 1 else ''} left out; all steps: {spread}")
    return f"mean of {n} measured step{'s' if n != 1 else ''}, {timeline_name(stats)}; {spread}"


def noise_line(profile: Profile, stats: StepStats) -> str:
    """The run's own noise (issue #29): how much its steps varied, and what else used the machine
    while they ran, so a reader knows how small a difference this run can tell from noise."""
    n = stats.n_steps
    if stats.irregular:  # an eval or a checkpoint is not noise: the typical steps' own spread
        k = len(stats.typical)
        varied = (f"this run's typical steps varied {pct(stats.typical_spread, 0)} ((p90 − p10) ÷ median of "
                  f"{k} step{'s' if k != 1 else ''}, the irregular ones left out)")
    else:
        varied = (f"this run's steps varied {pct(stats.spread, 0)} ((p90 − p10) ÷ median of {n} step"
                  f"{'s' if n != 1 else ''})")
    text = (f"{varied}: a step-time difference of that order between two runs is noise unless "
            f"`gpuprof compare` gives it an interval that excludes it")
    host = profile.sections.host
    others, cores = host.mean("others_cpu_cores"), host.cpu_count
    if others is not None and cores:
        text += f"; other processes used {others:.2f} of {cores} cores meanwhile"
    else:
        text += f"; other processes' CPU {NM} (no host samples)"
    if stats.timeline == "gpu":
        text += f"; other work on the GPU {NM} (NVML's utilisation is the device's, not per process)"
    return text


def throughput_text(profile: Profile, stats: StepStats) -> str:
    """Tokens per second at the typical step: the job's for a merged data-parallel run, and over
    the whole run when irregular steps slowed it."""
    world = int(profile.run.get("world_size") or 1) if profile.ranks else 1
    if not stats.tokens_per_step:  # an attached run: the tokens a step consumes are not seen from outside
        return "tokens/s not measured (no token count)"
    text = f"{stats.tokens_per_s * world:,.0f} tokens/s"
    if world > 1:
        me = profile.run.get("rank")
        view = MergedView.of_run(profile.run)
        slow = " (the slowest)" if view is not None and view.slowest else ""
        text += f" for the job ({world} ranks); the step and phases are rank {me}'s{slow}"
    if stats.irregular:
        text += f" ({stats.run_tokens_per_s * world:,.0f} over the whole run)"
    return text


def sharding_line(s) -> str | None:
    """How the model is sharded (measurements.sharding, gpuprof.measure.sharding), or None."""
    if not isinstance(s, dict) or not s.get("kind"):
        return None
    units = s.get("units") or []
    if s["kind"] == "fsdp2":
        names = ", ".join(u["module"] for u in units[:3]) + (f" … {units[-1]['module']}" if len(units) > 3 else "")
        resharded = sum(1 for u in units if u.get("reshard_after_forward"))
        dtypes = sorted({u.get("param_dtype") or "the parameters' own dtype" for u in units})
        text = (f"FSDP2, {len(units)} unit{'s' if len(units) != 1 else ''} ({names}); reshard_after_forward on "
                f"{resharded} of {len(units)}; all-gathered in {', '.join(dtypes)}")
    else:
        text = f"tensor parallel (DTensor parameters, placements {', '.join(s.get('placements') or []) or NM})"
    text += (f"; {count(s.get('params_total') or 0)} parameters in all, {count(s.get('params_local') or 0)} on this "
             f"rank (mesh {s.get('mesh_shape') or NM})")
    return text


def step_rule_text(rule) -> str | None:
    """What a script's step is and what showed it (sections.script.StepRule), or None when no
    rule was recorded (an older profile, the built-in loop, an attached run)."""
    marker = rule.marker or NM
    if rule.rule == STEP_OPTIMIZER:
        return f"one per optimizer step: {marker} ends each; the backward calls before it are its micro-steps"
    if rule.rule == STEP_ZERO_GRAD:
        return (f"one per parameter update: no optimizer step was seen, and {marker} reset the gradients of "
                f"a backward, so they were consumed by an update made by hand (e.g. p.data.add_); each reset "
                f"opens the next step, the backward calls since the last one are its micro-steps")
    if rule.rule == STEP_BACKWARD:
        return ("one per loop iteration holding a backward: no torch.optim optimizer in the process and no "
                "gradient reset between backwards, so the forward after a backward opens the next step")
    return None


def micro_text(stats: StepStats) -> str | None:
    n = stats.micro_steps
    return f"{n} micro-step{'s' if n != 1 else ''} per step" if n else None


def view_text(view: MergedView) -> str:
    """Whose steps and measurements a merged profile shows, and why (gpuprof.merge's choice): an
    older profile's stored sentence as it was."""
    if view.text:
        return view.text
    who = f"rank {view.rank if view.rank is not None else NM}"
    if view.slowest:
        why = "the slowest rank"
        mine = view.busy_s.get(view.rank)
        others = sorted(s for r, s in view.busy_s.items() if r != view.rank)
        if mine is not None and others:
            rest = seconds(others[0]) if len(others) == 1 else f"{seconds(others[0])} to {seconds(others[-1])}"
            why += f": busy {seconds(mine)} per step, the other ranks {rest}"
    else:
        why = "the lowest rank with a profile: no slowest rank, the ranks' communication was not measured on two"
    return f"{who} ({why}); every rank under `ranks`"


# ------------------------------------------------------------------------------------ MFU
def mfu_text(m: MfuResult | None) -> str:
    """MFU in one line: against the datasheet peak and/or the measured ceiling, and the rate."""
    if m is None:
        return NM
    dtype = m.dtype or ""
    device = m.device_label or "this device"
    parts = []
    if m.mfu is not None:
        parts.append(f"{pct(m.mfu)} of the {dtype} datasheet peak of {device} ({flops_rate(m.peak_tflops)})")
    if m.mfu_vs_ceiling is not None:
        parts.append(f"{pct(m.mfu_vs_ceiling)} of the {m.ceiling_dtype or dtype} matmul ceiling measured "
                     f"here ({flops_rate(m.ceiling_tflops)})")
    if not parts:
        why = "; ".join(m.warnings)
        parts.append(NM + (f" ({why})" if why else ""))
    elif m.mfu is None and not m.peak_tflops:
        parts.append(f"no datasheet peak for {device}")
    if m.achieved_tflops is not None:
        parts.append(f"achieved {flops_rate(m.achieved_tflops)}")
    return "; ".join(parts)


# ------------------------------------------------------------------------------------ what ran
def precision_line(prec: PrecisionSection) -> str:
    """What the matmuls computed in, and the observations it rests on (measurements.precision)."""
    ac = prec.autocast_dtype
    seen = [f"autocast {ac}" if ac else "no autocast", f"weights {prec.param_dtype or NM}"]
    if prec.tf32_source and not prec.tf32_source.startswith(NA):
        tf32 = prec.tf32_matmul
        seen.append("TF32 " + (NM if tf32 is None else "on" if tf32 else "off"))
    line = f"{prec.compute_dtype} matmuls ({', '.join(seen)})"
    if prec.tf32_note:
        line += f"; {prec.tf32_note}"
    return line


def attention_line(att) -> str | None:
    """How the traced forward computed attention: 'by hand in 12 layers' or 'F.scaled_dot_product_attention
    in 12 calls: flash kernel' (the kernels torch ran, counted), with torch's own modules named
    (nn.MultiheadAttention computing it by hand, or calling SDPA inside); None when not traced or
    none seen."""
    def plural(n, word):
        return f"{n} {word}{'s' if n != 1 else ''}"

    parts = []
    own = [c for c in att.by_hand if not c.torch_module]
    torch_hand = [c for c in att.by_hand if c.torch_module]
    if own:
        parts.append(f"by hand in {plural(len(own), 'layer')} (q·kᵀ, softmax, ·v)")
    if torch_hand:
        sites = sorted({c.call_site for c in torch_hand if c.call_site})
        parts.append(f"by hand inside {torch_hand[0].torch_module} in {plural(len(torch_hand), 'call')} "
                     f"(need_weights=True{', at ' + ', '.join(sites[:2]) if sites else ''})")
    for label, calls in (("F.scaled_dot_product_attention", [c for c in att.sdpa if not c.torch_module]),
                         ("F.scaled_dot_product_attention inside nn.MultiheadAttention (need_weights=False)",
                          [c for c in att.sdpa if c.torch_module])):
        if not calls:
            continue
        kernels: dict[str, int] = {}
        for c in calls:
            kernels[c.backend or UNKNOWN] = kernels.get(c.backend or UNKNOWN, 0) + 1
        parts.append(f"{label} in {plural(len(calls), 'call')}: "
                     + ", ".join(f"{k} kernel" + (f" ×{v}" if len(kernels) > 1 else "") for k, v in kernels.items()))
    return "; ".join(parts) or None


def what_ran(profile: Profile, stats: StepStats | None) -> list[tuple[str, str]]:
    """(label, text) rows: whose view, the script, device, model, step shape, settings,
    precision, data, how it ended, software."""
    run, cfg, env = profile.run, profile.config, profile.environment
    view = MergedView.of_run(run)
    rows = [("view", view_text(view))] if view is not None else []
    if run.get("mode") == "script":
        rows.append(("script", " ".join(str(c) for c in run.get("command") or []) or NM))
        steps = step_rule_text(Sections.of(profile).script.steps)
        if steps:
            rows.append(("steps", steps))
    elif run.get("mode") == "attach":
        rows += attach_rows(profile)
    else:
        rows.append(("run", "gpuprof's built-in GPT loop"))
    rows.append(("device", f"{env.get('device_name') or NM} ({cfg.get('device') or env.get('device') or UNKNOWN})"))
    dims = cfg.get("model_dims") or {}
    model = str(cfg.get("model") or NM)
    if dims:
        model += "  " + " ".join(f"{k}={dims.get(k, NM)}" for k in ("n_layer", "n_head", "n_embd", "vocab_size"))
    if cfg.get("param_count"):
        model += f"  {count(cfg['param_count'])} params"
    rows.append(("model", model))
    sharding = sharding_line(profile.measurements.get("sharding"))
    if sharding:
        rows.append(("sharding", sharding))
    shape = [f"{lab} {cfg[k]}" for k, lab in (("batch_size", "batch"), ("block_size", "block"),
                                              ("grad_accum", "accum")) if cfg.get(k) is not None]
    tps = cfg.get("tokens_per_step") or (stats.tokens_per_step if stats else None)
    rows.append(("step", " × ".join(shape) + (f" = {tokens(tps)} tokens/step" if tps else "")))
    settings = [f"{k}={cfg[k]}" for k in ("dtype", "compile", "pin_memory") if k in cfg]
    if settings:
        rows.append(("settings", "  ".join(settings)))
    prec = Sections.of(profile).precision  # run.config.precision in older files
    if prec.compute_dtype:
        rows.append(("precision", precision_line(prec)))
    attention = attention_line(Sections.of(profile).kernels.attention)
    if attention:
        rows.append(("attention", attention))
    if run.get("data_path"):
        rows.append(("data", str(run["data_path"]) + (" (generated)" if run.get("data_generated") else "")))
    if run.get("ended") in ("failed", "interrupted") or run.get("partial"):
        err = run.get("error") or {}
        rows.append(("ended", f"{run.get('ended') or 'partial'}"
                     + (f": {err.get('type', '')} {err.get('message', '')}".rstrip() if err else "")))
    if run.get("mode") == "attach":  # from outside: gpuprof's own Python, the target's versions unread
        rows.append(("software", f"gpuprof {profile.tool.get('version', NM)} on Python {env.get('python') or NM}; "
                                 "the target's torch and Python are not read from outside"))
    else:
        rows.append(("software", f"torch {env.get('torch') or NM}, Python {env.get('python') or NM}, "
                                 f"gpuprof {profile.tool.get('version', NM)}"))
    return rows


# --------------------------------------------------------------------------------- the notes
def not_measured_lines(profile: Profile, analysis) -> list[str]:
    """What could not be measured in this run, and why (a failed probe, unreadable CUDA events),
    and what the bounds check had to leave out."""
    lines = []
    sections = Sections.of(profile)
    timer = sections.timer
    if timer.reasons:
        which = timer.steps_unresolved
        scope = f"{len(which)} step(s)" if which else "this run"
        lines.append(f"GPU timeline not measured for {scope} (host wall time used): {'; '.join(timer.reasons)}")
    for name, reason in sections.unmeasured():
        lines.append(f"{name}: not measured: {reason}")
    st = sections.settle
    if st.settled is False and len(st.between) == 2:
        added = " and ".join(f"{n} more for {f}" for n, f in zip(st.rounds_added, st.between)) or "no more"
        lines.append(f"ranking not settled: {st.between[0]} and {st.between[1]} stay tied within noise ({added} "
                     f"paired rounds; {st.why or 'the post-run budget ran out'}); --post-budget gives the "
                     f"rounds more time")
    for d in st.noise:
        if isinstance(d, dict) and d.get("within_noise") and (d.get("rounds_added") or 0) < (d.get("planned") or 0):
            lines.append(f"{d.get('fix')} not decided: still within noise after {d.get('rounds_added') or 0} of the "
                         f"{d.get('planned')} more paired rounds planned to decide it ({d.get('why') or 'the post-run budget ran out'}); "
                         f"--post-budget gives the rounds more time")
    return lines


def attribution_lines(profile: Profile) -> list[str]:
    """Script mode: where each phase's host time went in the user's code (stack sampler), e.g.
    "data: 93% of samples in get_batch (train.py:117), hottest line 121"."""
    script = Sections.of(profile).script
    lines = []
    order = {p: i for i, p in enumerate(PHASES)}
    for phase in sorted(script.top_functions, key=lambda p: order.get(p, len(order))):
        e = script.top_function(phase)
        if e is None:
            continue
        func = "module level" if e.function == "<module>" else e.function
        lines.append(f"{phase}: {e.share:.0%} of samples in {func} ({e.file}:{e.line}), "
                     f"hottest line {e.hot_line}")
    s = script.sampler
    if lines and s is not None:
        lines.insert(0, f"user code by phase (stack samples every {s.interval_s * 1e3:.0f} ms: "
                        f"{s.samples} samples, {s.misses} missed):")
    if script.h2d_note:
        lines.append(f"h2d: {script.h2d_note}")
    return lines


def script_log_line(profile: Profile, stats: StepStats | None) -> str | None:
    """Script mode: the script's own step time (any log format gpuprof.steplog reads) beside
    gpuprof's typical step."""
    rep = Sections.of(profile).script.reported
    if not rep.lines:
        return None
    fmt = rep.format or "nanogpt"  # profiles before other formats were read: nanoGPT only
    ms = rep.step_ms_median
    what = {"nanogpt": "time", "build-nanogpt": "dt", "nanochat": "dt", "llm.c": "step time",
            "litgpt": "iter time"}.get(fmt, "step time")
    parts = [f"{fmt} format, {rep.lines} {'log' if fmt == 'hf-trainer' else 'step'} lines"]
    if ms is None:
        parts.append(f"no per-step time: {rep.note}" if rep.note else "no step time")
    elif (rep.step_ms_source or "").startswith("train_steps_per_second"):
        parts.append(f"{ms:.2f} ms per step from train_steps_per_second (a whole-run average)")
    else:
        parts.append(f"median {what} {ms:.2f} ms")
    if rep.tokens_per_s_median is not None:
        parts.append(f"{count(rep.tokens_per_s_median)} tok/s")
    if rep.mfu_pct_median is not None:
        parts.append(f"mfu {rep.mfu_pct_median:.2f}%")
    elif rep.mfu_note:
        parts.append(rep.mfu_note)
    text = "the script's own log: " + ", ".join(parts)
    ours = stats.step_s if stats else None
    if ours:
        ratio = ours * 1e3 / ms if ms else None
        text += f"; gpuprof's typical step {ours * 1e3:.2f} ms" + (f" ({ratio:.2f}×)" if ratio else "")
    return text
