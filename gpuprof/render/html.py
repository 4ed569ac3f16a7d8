"""A Profile as one self-contained HTML page: inline CSS and SVG, no script, no external resource
(a Content-Security-Policy meta tag makes the browser refuse any request the page might make).
Builds a string, never writes.

Every figure comes from the profile; a section the run did not measure says "not measured".
Every string from the run (command, arguments, paths, config values, error messages, findings)
goes through html.escape, so an argument like `<script>` stays text.
"""

from __future__ import annotations

import html
import math
import statistics

from gpuprof.profile import PHASES, Profile
from gpuprof.render.format import count, pct, seconds, tokens
from gpuprof.render.trace import checked_ranks, rank_profile

NM = "not measured"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
PHASE_COLORS = {"data": "#d1495b", "h2d": "#edae49", "forward": "#00798c", "backward": "#30638e",
                "optimizer": "#66a182", "other": "#a0a0a0", "eval": "#8e5572"}
SERIES = ["#30638e", "#d1495b", "#66a182", "#edae49", "#8e5572", "#00798c", "#444444"]
STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:980px;color:#222;padding:0 12px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
th{font-weight:600;border-bottom:1px solid #ccc}td.n,th.n{text-align:right;white-space:nowrap}
table.kv td:first-child{font-weight:600;white-space:nowrap}
.nm{color:#8a6d00}.dim{color:#666;font-size:12px}.bad{color:#b00020}
pre{background:#f5f5f5;padding:8px 10px;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
.sw{display:inline-block;width:10px;height:10px;margin-right:5px;vertical-align:baseline}
svg{display:block;max-width:100%;height:auto;margin:4px 0}svg text{font:11px sans-serif;fill:#444}
dl{margin:2px 0 0;font-size:12px;color:#555}dt{display:inline;font-weight:600}dd{display:inline;margin:0 12px 0 4px}
ol.fixes>li{margin:0 0 10px}.fixline{margin:2px 0}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _num(x) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _bytes(x) -> str:
    if _num(x) is None:
        return NM
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f} {unit}"
    return f"{x:.0f} B"


def _nm(text: str = NM) -> str:
    return f'<p class="nm">{_e(text)}</p>'


def _kv(rows: list[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


# ------------------------------------------------------------------------------------ charts
def _line_chart(title: str, series: list[tuple], y_fmt, *, y_max=None,
                x_label: str = "s since the timer started", x_fmt=None,
                bands: list[tuple[float, float, str, str]] = (), bars: bool = False) -> str:
    """An SVG line chart, or bars at unit-spaced xs (step indices): series of (label, xs, ys[,
    colour]); a None y breaks the line. bands: shaded x ranges (start, end, label, colour)."""
    pts = [(x, y) for _, xs, ys, *_ in series for x, y in zip(xs, ys) if _num(x) is not None and _num(y) is not None]
    if not pts:
        return _nm(f"{title}: {NM}")
    W, H, L, R, T, B = 900, 170, 78, 12, 10, 30
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    first, last = x0, x1
    if bars:  # half a slot either side, so the first and last bars stay inside the axes
        x0, x1 = x0 - 0.5, x1 + 0.5
    x1 = x1 if x1 > x0 else x0 + 1
    if x_fmt is None:  # enough digits to tell the two ends apart
        digits = min(3, max(0, 1 - math.floor(math.log10(x1 - x0))))
        x_fmt = lambda x: f"{x:.{digits}f}"  # noqa: E731
    top = y_max if _num(y_max) else max(p[1] for p in pts)
    top = top if top > 0 else 1.0
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    sy = lambda y: T + (1 - min(max(y, 0.0), top) / top) * (H - T - B)  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>']
    for a, b, label, fill in bands:
        a, b = max(a, x0), min(b, x1)
        if b > a:
            out.append(f'<rect x="{sx(a):.1f}" y="{T}" width="{sx(b) - sx(a):.1f}" height="{H - T - B}" '
                       f'fill="{fill}"><title>{_e(label)}</title></rect>')
    out.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#999"/>'
               f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#999"/>'
               f'<text x="{L - 4}" y="{T + 9}" text-anchor="end">{_e(y_fmt(top))}</text>'
               f'<text x="{L - 4}" y="{H - B}" text-anchor="end">{_e(y_fmt(0))}</text>'
               f'<text x="{sx(first):.1f}" y="{H - 8}" text-anchor="middle">{_e(x_fmt(first))}</text>'
               f'<text x="{sx(last):.1f}" y="{H - 8}" text-anchor="middle">{_e(x_fmt(last))}</text>'
               f'<text x="{(L + W) / 2:.0f}" y="{H - 8}" text-anchor="middle">{_e(x_label)}</text>')
    legend = []
    for i, (label, xs, ys, *fixed) in enumerate(series):
        color = fixed[0] if fixed else SERIES[i % len(SERIES)]
        legend.append(f'<span class="sw" style="background:{color}"></span>{_e(label)}')
        seg: list[str] = []
        segs = [seg]
        for x, y in zip(xs, ys):
            if _num(x) is None or _num(y) is None:
                seg = []
                segs.append(seg)
                continue
            if bars:
                w = max(1.0, (W - L - R) / (x1 - x0) * 0.8)
                out.append(f'<rect x="{sx(x) - w / 2:.1f}" y="{sy(y):.1f}" width="{w:.1f}" '
                           f'height="{H - B - sy(y):.1f}" fill="{color}"><title>{_e(label)}: '
                           f'{_e(x_fmt(x))}: {_e(y_fmt(y))}</title></rect>')
            seg.append(f"{sx(x):.1f},{sy(y):.1f}")
        if not bars:
            for s in segs:
                if len(s) == 1:
                    x, y = s[0].split(",")
                    out.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>')
                elif s:
                    out.append(f'<polyline points="{" ".join(s)}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    out.append("</svg>")
    return f'<p class="dim">{_e(title)}: ' + " &nbsp; ".join(legend) + "</p>" + "".join(out)


# ------------------------------------------------------------------------------------ sections
def _header(p: Profile) -> str:
    run, cfg, env = p.run, p.run.get("config") or {}, p.environment
    rows = [("view", run["view"])] if run.get("view") else []  # a merged run: whose figures these are
    if run.get("mode") == "script":
        rows.append(("script", " ".join(str(c) for c in run.get("command") or []) or NM))
    else:
        rows.append(("run", "gpuprof's built-in GPT loop"))
    rows.append(("device", f"{env.get('device_name') or NM} ({cfg.get('device') or env.get('device') or '?'})"))
    dims = cfg.get("model_dims") or {}
    model = str(cfg.get("model") or NM)
    if dims:
        model += "  " + " ".join(f"{k}={dims.get(k, NM)}" for k in ("n_layer", "n_head", "n_embd", "vocab_size"))
    if cfg.get("param_count"):
        model += f"  {count(cfg['param_count'])} params"
    rows.append(("model", model))
    shape = [f"{lab} {cfg[k]}" for k, lab in (("batch_size", "batch"), ("block_size", "block"),
                                              ("grad_accum", "accum")) if cfg.get(k) is not None]
    tps = cfg.get("tokens_per_step") or p.summary.get("tokens_per_step")
    rows.append(("step", " × ".join(shape) + (f" = {tokens(tps)} tokens/step" if tps else "")))
    prec = cfg.get("precision") or {}
    if prec.get("compute_dtype"):
        rows.append(("precision", f"{prec['compute_dtype']} matmuls"))
    if run.get("data_path"):
        rows.append(("data", str(run["data_path"]) + (" (generated)" if run.get("data_generated") else "")))
    if run.get("ended") or run.get("partial"):
        err = run.get("error") or {}
        rows.append(("ended", f"{run.get('ended') or 'partial'}"
                     + (f": {err.get('type', '')} {err.get('message', '')}".rstrip() if err else "")))
    rows.append(("software", f"torch {env.get('torch') or NM}, Python {env.get('python') or NM}, "
                 f"gpuprof {p.tool.get('version', NM)}"))
    return _kv(rows)


def _headline(p: Profile) -> str:
    s = p.summary
    if not p.steps or not s:
        return _nm("no complete measured step: nothing to report")
    tl = "GPU timeline" if s.get("timeline") == "gpu" else "host wall time"
    tps = _num(s.get("tokens_per_s"))
    return (f"<p><b>step {_e(seconds(s.get('step_s')))} median</b> ({_e(tl)}; p10 "
            f"{_e(seconds(s.get('step_s_p10')))}, p90 {_e(seconds(s.get('step_s_p90')))}, "
            f"{_e(s.get('n_steps', len(p.steps)))} measured steps) &nbsp; <b>"
            + (_e(f"{tps:,.0f} tokens/s") if tps is not None else NM) + "</b></p>")


def _because(d: dict) -> str:
    """The evidence in words: the rule's `because` sentence, else its evidence dict worded with
    units (render.format.evidence_words), as the terminal report shows it."""
    from gpuprof.render.format import evidence_words

    text = d.get("because") or evidence_words(d.get("evidence") or {})
    return f'<div class="fixline">because: {_e(text)}</div>' if text else ""


def _findings(findings: list) -> str:
    if not findings:
        return _nm("no findings (the profile holds none)")
    out = ['<ol class="fixes">']
    for f in findings:
        d = f if isinstance(f, dict) else f.to_dict()
        kind = d.get("kind") or "fix"
        if kind in ("info", "verdict", "correction"):
            saving = kind
        elif _num(d.get("saving_s")) is None:
            saving = "saving: cannot estimate"
        else:
            saving = f"saves {seconds(d['saving_s'])} per step ({pct(d.get('saving_share'))} of the step)"
        out.append(f"<li><b>{_e(d.get('title') or d.get('id'))}</b> &mdash; {_e(saving)}")
        if d.get("fix"):
            out.append(f'<div class="fixline">fix: {_e(d["fix"])}</div>')
        if d.get("note"):
            out.append(f'<div class="fixline dim">note: {_e(d["note"])}</div>')
        out.append(_because(d) + "</li>")
    return "".join(out) + "</ol>"


def _corrected(p: Profile) -> str:
    from gpuprof.analysis.corrected import CorrectedConfig
    from gpuprof.recommend.config import flags, format_config

    cc = p.summary.get("corrected_config") or {}
    if not cc.get("overrides"):
        return _nm("no finding of this run is a config fix: nothing to correct")
    c = CorrectedConfig(cc["overrides"], cc.get("sources") or {}, cc.get("overridden") or [], cc.get("current") or {})
    return (f"<pre>{_e(format_config(c.overrides, c.header()))}</pre>"
            f"<p>flags: <code>{_e(flags(c.overrides))}</code></p>")


def _phases(p: Profile) -> str:
    s = p.summary
    phases = s.get("phases") or {}
    if not phases:
        return _nm()
    on_gpu = s.get("timeline") == "gpu"
    order = [ph for ph in PHASES if ph in phases] + [ph for ph in phases if ph not in PHASES]
    x, rects = 0.0, []
    for ph in order:
        w = max(0.0, _num(phases[ph].get("share")) or 0.0) * 1000
        rects.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="34" fill="{PHASE_COLORS.get(ph, "#555")}">'
                     f"<title>{_e(ph)}: {_e(pct(phases[ph].get('share')))}</title></rect>")
        x += w
    title = f"Where a step's time goes ({'GPU timeline' if on_gpu else 'host wall time'}, mean of {s.get('n_steps', 0)} steps)"
    head = "<tr><th>phase</th><th class=n>per step</th><th class=n>share</th>" + (
        "<th class=n>host time</th><th class=n>GPU idle exposed</th>" if on_gpu else "") + "</tr>"
    rows = []
    for ph in order:
        e = phases[ph]
        sw = f'<span class="sw" style="background:{PHASE_COLORS.get(ph, "#555")}"></span>'
        row = f"<tr><td>{sw}{_e(ph)}</td><td class=n>{_e(seconds(e.get('seconds')))}</td><td class=n>{_e(pct(e.get('share')))}</td>"
        if on_gpu:
            idle = seconds(e.get("idle_exposed_s")) if ph in ("data", "other") else "-"
            row += f"<td class=n>{_e(seconds(e.get('host_seconds')))}</td><td class=n>{_e(idle)}</td>"
        rows.append(row + "</tr>")
    return (f'<p class="dim">{_e(title)}</p><svg viewBox="0 0 1000 34" role="img" aria-label="phase shares">'
            f"<title>{_e(title)}</title>{''.join(rects)}</svg><table>{head}{''.join(rows)}</table>")


def _step_time(st, on_gpu: bool):
    return st.gpu_s if on_gpu else st.wall_s


def _steps(p: Profile) -> str:
    if not p.steps:
        return _nm()
    on_gpu = p.summary.get("timeline") == "gpu"
    warm, meas = p.warmup_steps, p.steps
    series = [("measured steps", [s.index for s in meas], [_step_time(s, on_gpu) for s in meas], "#30638e")]
    if warm:
        series.insert(0, ("warmup steps (not counted)", [s.index for s in warm],
                          [_step_time(s, on_gpu) for s in warm], "#d9b26f"))
    what = "GPU timeline" if on_gpu else "host wall time"
    return _line_chart(f"Step time per step ({what})", series, seconds, x_label="step",
                       x_fmt=lambda x: f"{x:.0f}", bars=True)


def _windows(p: Profile) -> list[tuple[float, float, str]]:
    out = []
    for steps, label, fill in ((p.warmup_steps, "warmup steps", "#f7efe1"), (p.steps, "measured steps", "#e8f0f8")):
        if steps:
            out.append((min(s.start_s for s in steps), max(s.start_s + s.wall_s for s in steps), label, fill))
    return out


def _series(tl: dict, keys: list[tuple[str, str]]) -> list[tuple[str, list, list]]:
    return [(label, tl.get("t_s") or [], tl.get(k) or []) for k, label in keys if tl.get(k)]


def _gpu(p: Profile) -> str:
    nv = (p.measurements or {}).get("nvml") or {}
    if not nv.get("available"):
        why = nv.get("reason") or nv.get("not_measured")
        return _nm(f"GPU utilization and memory: {NM}" + (f" ({why})" if why else ""))
    out = []
    for g in nv.get("gpus") or []:
        tl = g.get("timeline") or {}
        name = g.get("name") or "GPU"
        out.append(_line_chart(f"{name}: utilization (NVML)", _series(tl, [("gpu_util_pct", "GPU busy %"), ("mem_util_pct", "memory busy %")]),
                               lambda v: f"{v:.0f}%", y_max=100.0, bands=_windows(p)))
        out.append(_line_chart(f"{name}: memory used (NVML)", _series(tl, [("mem_used_bytes", "used")]), _bytes,
                               y_max=g.get("memory_total_bytes"), bands=_windows(p)))
    return "".join(out) or _nm(f"GPU utilization and memory: {NM}")


def _host(p: Profile) -> str:
    hs = (p.measurements or {}).get("host") or {}
    if not hs.get("available"):
        why = hs.get("reason") or hs.get("not_measured")
        return _nm(f"host CPU: {NM}" + (f" ({why})" if why else ""))
    tl = hs.get("timeline") or {}
    cores = hs.get("cpu_count")
    return (_line_chart("Host CPU (psutil)", _series(tl, [("cpu_pct", "machine %"), ("cpu_pct_max_core", "busiest core %")]),
                        lambda v: f"{v:.0f}%", y_max=100.0, bands=_windows(p))
            + _line_chart(f"CPU cores used (of {cores or NM})", _series(tl, [("own_cpu_cores", "this run"), ("others_cpu_cores", "other processes")]),
                          lambda v: f"{v:.2f}", y_max=cores, bands=_windows(p))
            + '<p class="dim">shaded: warmup steps (sand), measured steps (blue). A sample is a rate over '
              "one sampling interval, drawn at the interval's midpoint.</p>")


def _ranks(p: Profile, ranks: list) -> str:

    rows, series = [], []
    for r in sorted(ranks, key=lambda r: r.get("rank", 0)):
        rp = rank_profile(r) if r.get("profile") is not None else None
        steps = rp.steps if rp else []
        on_gpu = bool(rp) and rp.summary.get("timeline") == "gpu"
        times = [_step_time(s, on_gpu) for s in steps]
        med = statistics.median(times) if times else None
        err = r.get("error") if isinstance(r.get("error"), dict) else {}
        cls = "" if r.get("status") == "ok" else ' class="bad"'
        rows.append(f"<tr><td class=n>{_e(r.get('rank'))}</td><td>{_e(r.get('host') or NM)}</td>"
                    f"<td class=n>{_e(r.get('local_rank'))}</td><td{cls}>{_e(r.get('status') or '?')}</td>"
                    f"<td class=n>{len(steps)}</td><td class=n>{_e(seconds(med) if med is not None else NM)}</td>"
                    f"<td>{_e(' '.join(str(err.get(k, '')) for k in ('type', 'message')).strip())}</td></tr>")
        if steps:
            series.append((f"rank {r.get('rank')}", [s.index for s in steps], times))
    table = ("<table><tr><th class=n>rank</th><th>host</th><th class=n>local</th><th>status</th>"
             "<th class=n>steps</th><th class=n>median step</th><th>error</th></tr>" + "".join(rows) + "</table>")
    chart = _line_chart("Step time per rank (each rank on its own timeline)", series, seconds, x_label="step",
                        x_fmt=lambda x: f"{x:.0f}")
    return table + chart


def _notes(p: Profile) -> str:
    from gpuprof.render.terminal import not_measured_lines, script_lines

    lines = not_measured_lines(p) + [ln.strip() for ln in script_lines(p)]
    return "<ul>" + "".join(f"<li>{_e(ln)}</li>" for ln in lines) + "</ul>" if lines else ""


def render_html(profile: Profile, findings: list | None = None) -> str:
    """The whole report page (findings: Finding objects or dicts; default the profile's own)."""
    p = profile
    findings = p.findings if findings is None else findings
    ranks = checked_ranks(p)
    title = "gpuprof report" + (" (partial)" if p.run.get("partial") else "")
    parts = [f"<h1>{_e(title)}</h1>", _header(p), _headline(p),
             "<h2>Ranked fixes</h2>", _findings(findings),
             "<h2>Corrected config</h2>", _corrected(p),
             "<h2>Phase breakdown</h2>", _phases(p),
             "<h2>Step times over the run</h2>", _steps(p),
             "<h2>GPU utilization and memory</h2>", _gpu(p),
             "<h2>Host CPU</h2>", _host(p)]
    if ranks:
        parts += ["<h2>Ranks</h2>", _ranks(p, ranks)]
    notes = _notes(p)
    if notes:
        parts += ["<h2>Not measured, and where the time went in the script</h2>", notes]
    parts.append(f'<p class="dim">gpuprof {_e(p.tool.get("version", ""))}, profile schema '
                 f"{_e(p.schema_version)}. Every figure on this page is from the profile; "
                 f"&ldquo;{NM}&rdquo; where the run did not measure it.</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="generator" content="gpuprof">'  # how gpuprof knows its own file (files.KINDS)
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(parts) + "\n</body></html>\n")
