"""The terminal report (rich). Only renderers print; this one prints to the console it is given."""

from __future__ import annotations

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.analysis.findings import Finding
from gpuprof.profile import PHASES
from gpuprof.profile import Profile
from gpuprof.render.format import count, pct, seconds, tokens


def run_header(profile: Profile) -> Table:
    cfg = profile.run.get("config", {})
    env = profile.environment
    dims = cfg.get("model_dims") or {}
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
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


def phase_table(profile: Profile) -> Table:
    s = profile.summary
    on_gpu = s.get("timeline") == "gpu"
    t = Table(title=f"Where a step's time goes ({'GPU timeline' if on_gpu else 'host wall time'}, "
                    f"mean of {s.get('n_steps', 0)} steps)", title_justify="left")
    t.add_column("phase")
    t.add_column("per step", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", justify="left")
    if on_gpu:
        t.add_column("host time", justify="right")
        t.add_column("GPU idle exposed", justify="right")
    phases = s.get("phases", {})
    for name in PHASES:
        if name not in phases:
            continue
        e = phases[name]
        bar = "█" * int(round(e["share"] * 30))
        row = [name, seconds(e["seconds"]), pct(e["share"]), Text(bar, style="cyan")]
        if on_gpu:
            idle = e.get("idle_exposed_s")
            row += [seconds(e.get("host_seconds")), seconds(idle) if name in ("data", "other") else "-"]
        t.add_row(*row)
    return t


def step_line(profile: Profile) -> Text:
    s = profile.summary
    text = Text()
    text.append("step ", style="bold")
    text.append(f"{seconds(s.get('step_s'))} median", style="bold green")
    text.append(f"  (p10 {seconds(s.get('step_s_p10'))}, p90 {seconds(s.get('step_s_p90'))}, "
                f"spread {pct(s.get('spread'), 0)})")
    text.append("   throughput ", style="bold")
    text.append(f"{s.get('tokens_per_s', 0):,.0f} tokens/s", style="bold green")
    if s.get("micro_steps"):
        text.append(f"   {s['micro_steps']} micro-steps/step")
    return text


def findings_table(findings: list[Finding | dict]) -> Table:
    t = Table(title="Findings (ranked by time saved per step)", title_justify="left", show_lines=False)
    t.add_column("#", justify="right")
    t.add_column("finding")
    t.add_column("saves/step", justify="right")
    t.add_column("share", justify="right")
    for i, f in enumerate(findings, 1):
        d = f.to_dict() if isinstance(f, Finding) else f
        body = Text(d["title"], style="bold")
        ev = d.get("evidence") or {}
        if ev:
            body.append("\n  evidence: " + _evidence_line(ev), style="dim")
        if d.get("fix"):
            body.append("\n  fix: " + d["fix"])
        if d.get("note"):
            body.append("\n  note: " + d["note"], style="yellow")
        if d.get("kind") in ("info", "verdict", "correction"):
            saving, share = d["kind"], ""
        elif d.get("saving_s") is None:
            saving, share = "cannot estimate", ""
        else:
            saving, share = seconds(d["saving_s"]), pct(d.get("saving_share"))
        t.add_row(str(i), body, saving, share)
    return t


def _evidence_line(ev: dict) -> str:
    parts = []
    for k, v in ev.items():
        if isinstance(v, float):
            if k.endswith("share") or k.endswith("_pct_frac"):
                parts.append(f"{k}={v:.1%}")
            elif k.endswith("_s"):
                parts.append(f"{k}={seconds(v)}")
            else:
                parts.append(f"{k}={v:.4g}")
        elif isinstance(v, (dict, list)) or v is None:  # None: not measured, nothing to show
            continue
        else:
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def render_diagnosis(profile: Profile, findings: list, console: Console, extra: list | None = None) -> None:
    """Print the full report: run, phases, step time, extra panels (MFU, samplers), findings."""
    title = "gpuprof diagnosis" + (" (partial)" if profile.run.get("partial") else "")
    console.print(Panel(run_header(profile), title=title, title_align="left"))
    if not profile.steps:
        console.print("[yellow]no complete measured step: nothing to report[/yellow]")
        return
    console.print(phase_table(profile))
    console.print(step_line(profile))
    for line in not_measured_lines(profile):
        console.print(line, style="yellow", highlight=False)
    for renderable in extra or []:
        console.print(renderable)
    for line in script_lines(profile):
        console.print(line, highlight=False)
    if findings:
        console.print(findings_table(findings))
    panel = corrected_config_panel(profile.summary.get("corrected_config"))
    if panel is not None:
        console.print(panel)


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


def script_lines(profile: Profile) -> list[str]:
    """Script mode: where each phase's host time went in the user's code (stack sampler), and
    the script's own step time (any log format gpuprof.steplog reads) beside gpuprof's, e.g.
    "data: 93% of samples in get_batch (train.py:117)", "the script's own log: build-nanogpt
    format, 8 step lines, median dt 123.45 ms, 12.3K tok/s; gpuprof measured 125.10 ms per step
    (1.01×)"."""
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
    rep = section.get("reported") or {}
    if rep.get("lines"):
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
            text += f"; gpuprof measured {ours * 1e3:.2f} ms per step" + (f" ({ratio:.2f}×)" if ratio else "")
        lines.append(text)
    return lines
