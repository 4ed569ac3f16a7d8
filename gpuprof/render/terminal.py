"""The terminal report (rich). Only renderers print; this one prints to the console it is given.

The report reads top to bottom as a reader needs it: the step (its one labelled figure), the
verdict, the ranked fixes with their saving, change and evidence in words, the corrected
config; then where the time goes (phase table and a timeline of a typical step), MFU in one
line and what ran. The details (MFU table, samplers, user-code attribution) follow only when
asked for. Every part fits the console's width without truncating or breaking a word."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.analysis.findings import Finding
from gpuprof.profile import PHASES, Profile
from gpuprof.render.format import count, evidence_words, flops_rate, pct, seconds, tokens
from gpuprof.render.timeline import FillBar, step_timeline

DETAILS_HINT = "more with --details: the MFU table, the GPU and host samplers, user-code attribution"


def render_diagnosis(profile: Profile, findings: list, console: Console, extra: list | None = None, *,
                     details: bool = False) -> None:
    """Print the report: the step, the verdict, the ranked fixes, the corrected config, the phase
    table with a timeline of a typical step, MFU in one line, what ran; with details=True also the
    MFU table, the samplers and the user-code attribution.

    extra: renderables for the details part, shown with details=True in place of the ones built
    here from the profile (MFU table, samplers); None builds them."""
    title = "gpuprof diagnosis" + (" (partial)" if profile.run.get("partial") else "")
    console.print(Text(title, style="bold"), Text(f": {run_line(profile)}"), sep="", highlight=False)
    if not profile.steps:
        console.print(Panel(run_header(profile), title="What ran", title_align="left"))
        console.print("[yellow]no complete measured step: nothing to report[/yellow]")
        return
    console.print(step_line(profile))
    for line in script_log_lines(profile):
        console.print(line, highlight=False)
    console.print()
    console.print(findings_view(findings))
    panel = corrected_config_panel(profile.summary.get("corrected_config"))
    if panel is not None:
        console.print(panel)
    console.print()
    console.print(phase_table(profile))
    timeline = step_timeline(profile)
    if timeline is not None:
        console.print(timeline)
    console.print(mfu_line(profile.summary.get("mfu")), highlight=False)
    for line in not_measured_lines(profile):
        console.print(line, style="yellow", highlight=False)
    console.print(Panel(run_header(profile), title="What ran", title_align="left"))
    if not details:
        console.print(Text(DETAILS_HINT, style="dim"))
        return
    console.rule("Details", align="left")
    if extra is None:
        from gpuprof.render.mfu import mfu_panel, samplers_panel

        extra = ([mfu_panel(profile.summary["mfu"])] if profile.summary.get("mfu") else []) + (
            [samplers_panel(profile.measurements)] if profile.measurements else [])
    for renderable in extra:
        console.print(renderable)
    for line in attribution_lines(profile):
        console.print(line, highlight=False)


def run_line(profile: Profile) -> str:
    """What ran, in one line: the model and the device."""
    cfg = profile.run.get("config", {})
    env = profile.environment
    model = cfg.get("model") or ("a script" if profile.run.get("mode") == "script" else "a model")
    if cfg.get("param_count"):
        model += f" ({count(cfg['param_count'])} parameters)"
    return f"{model} on {env.get('device_name') or cfg.get('device') or 'not measured'}"


def step_line(profile: Profile) -> Text:
    """The step: the one place its figure is printed with its statistic (summary.step_s, the
    median step on the summary's timeline); everything else that names the step uses this value."""
    s = profile.summary
    on_gpu = s.get("timeline") == "gpu"
    text = Text()
    text.append("step ", style="bold")
    text.append(seconds(s.get("step_s")), style="bold green")
    text.append(f" (median of {s.get('n_steps', len(profile.steps))} measured steps, "
                f"{'GPU timeline' if on_gpu else 'host wall time'}; p10 {seconds(s.get('step_s_p10'))}, "
                f"p90 {seconds(s.get('step_s_p90'))}, spread {pct(s.get('spread'), 0)})")
    text.append(" · ")
    world = int(profile.run.get("world_size") or 1) if profile.ranks else 1
    if world > 1:  # a merged data-parallel run: the figures above are one rank's view
        text.append(f"{s.get('tokens_per_s', 0) * world:,.0f} tokens/s", style="bold green")
        slow = ((profile.measurements.get("distributed") or {}).get("slowest") or {}).get("rank")
        me = profile.run.get("rank")
        text.append(f" for the job ({world} ranks); the step and phases are rank {me}'s"
                    + (" (the slowest)" if me == slow else ""))
    else:
        text.append(f"{s.get('tokens_per_s', 0):,.0f} tokens/s", style="bold green")
    if s.get("micro_steps"):
        n = s["micro_steps"]
        text.append(f" · {n} micro-step{'s' if n != 1 else ''} per step")
    return text


# ------------------------------------------------------------------------------------ findings
def _as_dict(f: Finding | dict) -> dict:
    return f.to_dict() if isinstance(f, Finding) else f


def because_text(d: dict) -> str:
    """The evidence in words: the rule's own sentence, else the evidence dict worded generically."""
    return d.get("because") or evidence_words(d.get("evidence") or {})


def saving_text(d: dict) -> str | None:
    """What a finding saves per step, in words (None for a verdict or information)."""
    kind = d.get("kind") or "fix"
    if kind == "correction":
        return "no time: it corrects a figure"
    if kind != "fix":
        return None
    if d.get("saving_s") is None:
        return "not estimated (the note says why)"
    if d["saving_s"] <= 1e-9 and d.get("overlaps"):  # its whole interval is another fix's saving
        return f"nothing more: its time is already counted in {', '.join(d['overlaps'])}"
    return f"{seconds(d['saving_s'])} per step ({pct(d.get('saving_share'))} of the step)"


def _fields(rows: list[tuple[str, str, str]]) -> Table:
    """Labelled lines of a finding: the label never wraps, the text wraps at words under itself."""
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style="bold")
    t.add_column(ratio=1, overflow="fold")
    for label, text, style in rows:
        if text:
            t.add_row(label, Text(text, style=style))
    return t


def _finding_block(d: dict, marker: str) -> Group:
    head = Table.grid(padding=(0, 1))
    head.add_column(no_wrap=True, justify="right")
    head.add_column(ratio=1, overflow="fold")
    head.add_row(marker, Text(d.get("title") or d.get("id") or "", style="bold"))
    saving = saving_text(d)
    if saving and d.get("confidence"):
        saving += f"; confidence {d['confidence']}"
    rows = [("saves", saving or "", "green" if d.get("saving_s") else ""),
            ("change", d.get("fix") or "", ""),
            ("because", because_text(d), ""),
            ("note", d.get("note") or "", "dim")]
    return Group(head, Padding(_fields(rows), (0, 0, 0, len(marker) + 1)))


def findings_view(findings: list[Finding | dict]) -> Group:
    """The verdict, the fixes ranked by the time they save (each with its saving, the change and
    the evidence in words), corrections of wrong figures, and what else was found."""
    ds = [_as_dict(f) for f in findings or []]
    verdicts = [d for d in ds if d.get("kind") == "verdict"]
    fixes = [d for d in ds if (d.get("kind") or "fix") == "fix"]
    corrections = [d for d in ds if d.get("kind") == "correction"]
    infos = [d for d in ds if d.get("kind") not in ("verdict", "fix", "correction", None, "")]  # info, new kinds
    parts: list[RenderableType] = []
    if verdicts:
        for d in verdicts:
            parts.append(_finding_block(d, "Verdict:"))
    elif fixes:
        top = fixes[0]
        saving = f" saves {saving_text(top)}" if top.get("saving_s") is not None else " is the largest"
        parts.append(Text.assemble(("Verdict: ", "bold"), f"{top.get('title')}. Fix 1 below{saving}."))
    else:
        parts.append(Text.assemble(("Verdict: ", "bold"), "no finding: nothing in this run stands out"))
    if fixes:
        parts.append(Text("\nFixes, ranked by the time they save per step", style="bold underline"))
        parts += [_finding_block(d, f"{i}.") for i, d in enumerate(fixes, 1)]
    else:
        parts.append(Text("\nFixes: none found in this run", style="bold"))
    if corrections:
        parts.append(Text("\nCorrections (a wrong figure, not time)", style="bold underline"))
        parts += [_finding_block(d, "•") for d in corrections]
    if infos:
        parts.append(Text("\nAlso found", style="bold underline"))
        parts += [_finding_block(d, "•") for d in infos]
    return Group(*parts)


def findings_table(findings: list[Finding | dict]) -> Group:
    """The findings as the report shows them (kept under this name for the CLI's other verbs)."""
    return findings_view(findings)


# ------------------------------------------------------------------------------ where it goes
def phase_table(profile: Profile) -> Table:
    """Each phase's mean seconds per step and share, with a bar that uses the width there is."""
    s = profile.summary
    on_gpu = s.get("timeline") == "gpu"
    t = Table(title=f"Where a step's time goes: each phase's mean per step over {s.get('n_steps', 0)} steps "
                    f"({'GPU timeline' if on_gpu else 'host wall time'})", title_justify="left", expand=True)
    t.add_column("phase", no_wrap=True)
    t.add_column("per step", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("", ratio=1, no_wrap=True)
    if on_gpu:
        t.add_column("host time", justify="right", no_wrap=True)
        t.add_column("GPU idle", justify="right", no_wrap=True)
    phases = s.get("phases", {})
    names = [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES]
    for name in names:
        e = phases[name]
        share = e.get("share") or 0.0
        bar = FillBar(lambda w, share=share: ("█" * int(round(share * w))).ljust(w), "cyan")
        row = [name, seconds(e.get("seconds")), pct(share), bar]
        if on_gpu:
            idle = e.get("idle_exposed_s")
            row += [seconds(e.get("host_seconds")), seconds(idle) if name in ("data", "other") else "-"]
        t.add_row(*row)
    if on_gpu:
        t.caption = "GPU idle: time the GPU sat idle while the host ran a host-only phase"
        t.caption_justify = "left"
    return t


def mfu_line(mfu: dict | None) -> Text:
    """MFU in one line: against the datasheet peak and/or the measured ceiling, and the rate."""
    text = Text()
    text.append("MFU ", style="bold")
    m = mfu or {}
    dtype = m.get("dtype") or ""
    device = m.get("gpu_name") or m.get("device_name") or "this device"
    parts = []
    if m.get("mfu") is not None:
        parts.append(f"{pct(m['mfu'])} of the {dtype} datasheet peak of {device} ({flops_rate(m.get('peak_tflops'))})")
    if m.get("mfu_vs_ceiling") is not None:
        parts.append(f"{pct(m['mfu_vs_ceiling'])} of the {m.get('ceiling_dtype') or dtype} matmul ceiling measured "
                     f"here ({flops_rate(m.get('ceiling_tflops'))})")
    if not parts:
        why = "; ".join(m.get("warnings") or [])
        parts.append("not measured" + (f" ({why})" if why else ""))
    elif m.get("mfu") is None and not m.get("peak_tflops"):
        parts.append(f"no datasheet peak for {device}")
    if m.get("achieved_tflops") is not None:
        parts.append(f"achieved {flops_rate(m['achieved_tflops'])}")
    text.append("; ".join(parts))
    return text


# ------------------------------------------------------------------------------------ what ran
def run_header(profile: Profile) -> Table:
    cfg = profile.run.get("config", {})
    env = profile.environment
    dims = cfg.get("model_dims") or {}
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    mode = profile.run.get("mode", "?")
    if mode == "script":
        t.add_row("script", " ".join(profile.run.get("command") or []))
    t.add_row("device", f"{env.get('device_name') or 'not measured'} ({cfg.get('device', env.get('device', '?'))})")
    model = cfg.get("model") or "?"
    if dims:
        def dim(key):
            v = dims.get(key)
            return "not measured" if v is None else v

        model += f"  L={dim('n_layer')} H={dim('n_head')} d={dim('n_embd')} V={dim('vocab_size')}"
    if cfg.get("param_count"):
        model += f"  {count(cfg['param_count'])} params"
    t.add_row("model", model)
    parts = []
    for key, label in (("batch_size", "batch"), ("block_size", "block"), ("grad_accum", "accum")):
        if cfg.get(key) is not None:
            parts.append(f"{label} {cfg[key]}")
    tps = cfg.get("tokens_per_step") or profile.summary.get("tokens_per_step")
    if tps:
        parts.append(f"= {tokens(tps)} tokens/step")
    t.add_row("step", " × ".join(parts[:3]) + (" " + parts[3] if len(parts) > 3 else ""))
    extra = []
    for key in ("dtype", "compile", "pin_memory"):
        if key in cfg:
            extra.append(f"{key}={cfg[key]}")
    if extra:
        t.add_row("settings", "  ".join(extra))
    prec = cfg.get("precision") or {}
    if prec.get("compute_dtype"):
        t.add_row("precision", precision_line(prec))
    if profile.run.get("data_path"):
        gen = " (generated)" if profile.run.get("data_generated") else ""
        t.add_row("data", f"{profile.run['data_path']}{gen}")
    return t


def precision_line(prec: dict) -> str:
    """What the matmuls computed in, and the observations it rests on."""
    ac = prec.get("autocast_dtype")
    seen = [f"autocast {ac}" if ac else "no autocast", f"weights {prec.get('param_dtype') or 'not measured'}"]
    if prec.get("tf32_source") and not str(prec["tf32_source"]).startswith("not applicable"):
        tf32 = prec.get("tf32_matmul")
        seen.append("TF32 " + ("not measured" if tf32 is None else "on" if tf32 else "off"))
    line = f"{prec['compute_dtype']} matmuls ({', '.join(seen)})"
    if prec.get("tf32_note"):
        line += f"; {prec['tf32_note']}"
    return line


def not_measured_lines(profile: Profile) -> list[str]:
    """What could not be measured in this run, and why (a failed probe, unreadable CUDA events)."""
    lines = []
    timer = profile.measurements.get("timer") or {}
    if timer.get("reasons"):
        which = timer.get("steps_unresolved") or []
        scope = f"{len(which)} step(s)" if which else "this run"
        lines.append(f"GPU timeline not measured for {scope} (host wall time used): {'; '.join(timer['reasons'])}")
    for name, section in profile.measurements.items():
        if isinstance(section, dict) and section.get("not_measured"):
            lines.append(f"{name}: not measured: {section['not_measured']}")
    return lines


def corrected_config_panel(corrected: dict) -> Panel | None:
    """The merged config fixes as nanoGPT `key = value` lines and the equivalent flags."""
    from gpuprof.recommend.config import flags, format_config

    overrides = (corrected or {}).get("overrides") or {}
    if not overrides:
        return None
    current = corrected.get("current") or {}
    body = Text()
    for key, value in overrides.items():
        body.append(format_config({key: value}).strip(), style="bold")
        was = f"   # was {current[key]!r}" if key in current else ""
        body.append(f"{was}   ← {corrected['sources'][key]}\n", style="dim")
    body.append("flags: ", style="bold")
    body.append(flags(overrides))
    for fid, key, value in corrected.get("overridden") or []:
        body.append(f"\n{fid} also wanted {key} = {value!r} (a higher-ranked fix wins)", style="yellow")
    return Panel(body, title="Corrected config (write it with --write FILE)", title_align="left")


def attribution_lines(profile: Profile) -> list[str]:
    """Script mode: where each phase's host time went in the user's code (stack sampler), e.g.
    "data: 93% of samples in get_batch (train.py:117), hottest line 121"."""
    section = profile.measurements.get("script") or {}
    top = section.get("top_functions") or {}
    lines = []
    order = {p: i for i, p in enumerate(PHASES)}
    for phase, entries in sorted(top.items(), key=lambda kv: order.get(kv[0], len(order))):
        if not entries:
            continue
        e = entries[0]
        func = "module level" if e["function"] == "<module>" else e["function"]
        lines.append(f"  {phase}: {e['share']:.0%} of samples in {func} ({e['file']}:{e['line']}), "
                     f"hottest line {e['hot_line']}")
    s = section.get("sampler")
    if lines and s:
        lines.insert(0, f"user code by phase (stack samples every {s['interval_s'] * 1e3:.0f} ms: "
                        f"{s['samples']} samples, {s['misses']} missed):")
    note = (section.get("hooks") or {}).get("h2d_note")
    if note:
        lines.append(f"h2d: {note}")
    return lines


def script_log_lines(profile: Profile) -> list[str]:
    """Script mode: the script's own step time (any log format gpuprof.steplog reads) beside
    gpuprof's, e.g. "the script's own log: build-nanogpt format, 8 step lines, median dt 123.45 ms,
    12.3K tok/s; gpuprof measured 125.10 ms per step (1.01×)"."""
    section = profile.measurements.get("script") or {}
    rep = section.get("reported") or {}
    if not rep.get("lines"):
        return []
    fmt = rep.get("format") or "nanogpt"  # profiles before other formats were read: nanoGPT only
    ms = rep.get("step_ms_median")
    # Each format's own word for its step time.
    what = {"nanogpt": "time", "build-nanogpt": "dt", "llm.c": "step time"}.get(fmt, "step time")
    parts = [f"{fmt} format, {rep['lines']} {'log' if fmt == 'hf-trainer' else 'step'} lines"]
    if ms is None:
        parts.append(f"no per-step time: {rep['note']}" if rep.get("note") else "no step time")
    elif (rep.get("step_ms_source") or "").startswith("train_steps_per_second"):
        parts.append(f"{ms:.2f} ms per step from train_steps_per_second (a whole-run average)")
    else:
        parts.append(f"median {what} {ms:.2f} ms")
    tps = rep.get("tokens_per_s_median")
    if tps is not None:
        parts.append(f"{count(tps)} tok/s")
    if rep.get("mfu_pct_median") is not None:
        parts.append(f"mfu {rep['mfu_pct_median']:.2f}%")
    ours = profile.summary.get("step_s")
    text = "the script's own log: " + ", ".join(parts)
    if ours:
        ratio = rep.get("ratio") or (ours * 1e3 / ms if ms else None)
        # Two decimals in ms, as the script's own figure beside it: the same median step.
        text += f"; gpuprof measured {ours * 1e3:.2f} ms per step" + (f" ({ratio:.2f}×)" if ratio else "")
    return [text]


def script_lines(profile: Profile) -> list[str]:
    """Script mode: the user-code attribution, then the script's own step time beside gpuprof's."""
    return attribution_lines(profile) + script_log_lines(profile)
