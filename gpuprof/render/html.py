"""A Profile and its Analysis as one self-contained HTML page: the Report (gpuprof.report.model)
laid out with inline CSS and SVG charts of the measurements, no script, no external resource (a
Content-Security-Policy meta tag makes the browser refuse any request the page might make).
Builds a string, never writes.

Every sentence comes from the Report, as the terminal prints it; a section the run did not
measure says "not measured".
Every string from the run (command, arguments, paths, config values, error messages, findings)
goes through html.escape, so an argument like `<script>` stays text.
"""

from __future__ import annotations

import html

from gpuprof.profile import Profile, checked_ranks
from gpuprof.report import charts as ch
from gpuprof.report.model import FindingView, Report, build_report
from gpuprof.units import NM, finite
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
PHASE_COLORS = {"data": "#d1495b", "h2d": "#edae49", "forward": "#00798c", "backward": "#30638e",
                "comm": "#c44e52", "optimizer": "#66a182", "other": "#a0a0a0", "eval": "#8e5572"}
ROLE_COLORS = {"warmup": "#d9b26f", "measured": "#30638e"}  # a step series' bar colour
BAND_FILLS = {"warmup": "#f7efe1", "measured": "#e8f0f8"}  # shaded windows on a timeline
RANK_CELLS = (" class=n", "", " class=n", "")  # the rank table's columns: rank, local rank right-aligned
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
ol.fixes>li,ul.fixes>li{margin:0 0 10px}.fixline{margin:2px 0}h3{font-size:15px;margin:14px 0 6px}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _nm(text: str = NM) -> str:
    return f'<p class="nm">{_e(text)}</p>'


def _kv(rows: list[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


# ------------------------------------------------------------------------------------ charts
def _line_chart(c: ch.Chart) -> str:
    """A report chart as SVG: lines, or bars at unit-spaced xs (step indices); a None y breaks the
    line; bands are shaded x ranges."""
    title, series, x_label, bars = c.title, c.series, c.x_label, c.bars
    if not c.points:
        return _nm(c.missing)
    W, H, L, R, T, B = 900, 170, 78, 12, 10, 30
    (x0, x1), (first, last), top = c.x_span, c.x_ends, c.y_top
    first_text, last_text = c.x_end_texts
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    sy = lambda y: T + (1 - min(max(y, 0.0), top) / top) * (H - T - B)  # noqa: E731
    out = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>']
    for band in c.bands:
        a, b, label, fill = max(band.start, x0), min(band.end, x1), band.label, BAND_FILLS[band.role]
        if b > a:
            out.append(f'<rect x="{sx(a):.1f}" y="{T}" width="{sx(b) - sx(a):.1f}" height="{H - T - B}" '
                       f'fill="{fill}"><title>{_e(label)}</title></rect>')
    out.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#999"/>'
               f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="#999"/>'
               f'<text x="{L - 4}" y="{T + 9}" text-anchor="end">{_e(c.y_top_text)}</text>'
               f'<text x="{L - 4}" y="{H - B}" text-anchor="end">{_e(c.y_zero_text)}</text>'
               f'<text x="{sx(first):.1f}" y="{H - 8}" text-anchor="middle">{_e(first_text)}</text>'
               f'<text x="{sx(last):.1f}" y="{H - 8}" text-anchor="middle">{_e(last_text)}</text>'
               f'<text x="{(L + W) / 2:.0f}" y="{H - 8}" text-anchor="middle">{_e(x_label)}</text>')
    legend = []
    for i, sr in enumerate(series):
        label, xs, ys = sr.label, sr.xs, sr.ys
        color = ROLE_COLORS[sr.role] if sr.role else SERIES[i % len(SERIES)]
        legend.append(f'<span class="sw" style="background:{color}"></span>{_e(label)}')
        seg: list[str] = []
        segs = [seg]
        for x, y in zip(xs, ys):
            if finite(x) is None or finite(y) is None:
                seg = []
                segs.append(seg)
                continue
            if bars:
                w = max(1.0, (W - L - R) / (x1 - x0) * 0.8)
                out.append(f'<rect x="{sx(x) - w / 2:.1f}" y="{sy(y):.1f}" width="{w:.1f}" '
                           f'height="{H - B - sy(y):.1f}" fill="{color}">'
                           f'<title>{_e(c.tip(label, x, y))}</title></rect>')
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
def _header(r: Report) -> str:
    return _kv(r.what_ran)


def _headline(r: Report) -> str:
    if not r.has_steps:
        return _nm(r.headings.no_steps)
    micro = f" &middot; {_e(r.micro)}" if r.micro else ""
    out = (f"<p><b>{_e(r.headings.step)} {_e(r.step)}</b> ({_e(r.step_statistic)}) &middot; "
           f"<b>{_e(r.throughput)}</b>{micro}</p>")
    if r.script_log:
        out += f'<p class="dim">{_e(r.script_log)}</p>'
    if r.noise:
        out += f'<p class="dim"><b>{_e(r.headings.noise)}</b> {_e(r.noise)}</p>'
    return out


def _lines(v: FindingView, labels) -> str:
    return "".join(f'<div class="fixline{cls}">{_e(name)}: {_e(text)}</div>'
                   for name, text, cls in zip(labels, (v.saves_line, v.change, v.because, v.note), ("", "", "", " dim"))
                   if text)


def _finding(v: FindingView, labels) -> str:
    return f"<li><b>{_e(v.title)}</b>{_lines(v, labels)}</li>"


def _findings(r: Report) -> str:
    if not r.has_steps:
        return ""
    h = r.headings
    if r.verdict is not None:  # the verdict finding's title once, its lines under it
        parts = [f"<p><b>{_e(h.verdict)}</b> {_e(r.verdict.title)}</p>{_lines(r.verdict, h.finding_fields)}"]
    else:
        parts = [f"<p><b>{_e(h.verdict)}</b> {_e(r.verdict_text)}</p>"]
    for title, views, tag in ((h.irregular, r.irregular, "ul"), (h.fixes, r.fixes, "ol"),
                              (h.corrections, r.corrections, "ul"), (h.infos, r.infos, "ul")):
        if views:
            parts.append(f"<h3>{_e(title)}</h3><{tag} class=\"fixes\">"
                         + "".join(_finding(v, h.finding_fields) for v in views) + f"</{tag}>")
        elif tag == "ol":
            parts.append(_nm(h.no_fixes))
    return "".join(parts)


def _corrected(r: Report) -> str:
    if r.corrected is None:
        return _nm(r.headings.no_correction)
    conflicts = "".join(f'<p class="nm">{_e(c)}</p>' for c in r.corrected.conflicts)
    return (f"<pre>{_e(r.corrected.file_text)}</pre><p>{_e(r.headings.flags)} <code>{_e(r.corrected.flags)}</code></p>"
            + conflicts)


def _phases(r: Report) -> str:
    if not r.phase_rows:
        return _nm()
    x, rects = 0.0, []
    for row in r.phase_rows:
        w = max(0.0, row.share) * 1000
        rects.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="34" fill="{PHASE_COLORS.get(row.phase, "#555")}">'
                     f"<title>{_e(row.phase)}: {_e(row.share_text)}</title></rect>")
        x += w
    h = r.headings
    names = h.phase_columns + (h.gpu_columns if r.on_gpu else ())
    head = "<tr>" + "".join(f"<th{'' if i == 0 else ' class=n'}>{_e(n)}</th>" for i, n in enumerate(names)) + "</tr>"
    rows = []
    for row in r.phase_rows:
        sw = f'<span class="sw" style="background:{PHASE_COLORS.get(row.phase, "#555")}"></span>'
        cells = f"<tr><td>{sw}{_e(row.phase)}</td><td class=n>{_e(row.seconds)}</td><td class=n>{_e(row.share_text)}</td>"
        if r.on_gpu:
            cells += f"<td class=n>{_e(row.host)}</td><td class=n>{_e(row.idle)}</td>"
        rows.append(cells + "</tr>")
    total = (f"<tr><th>{_e(h.total)}</th><th class=n>{_e(r.phase_total[0])}</th><th class=n>{_e(r.phase_total[1])}</th>"
             + ("<th></th><th></th>" if r.on_gpu else "") + "</tr>")
    caption = f'<p class="dim">{_e(r.phase_caption)}</p>' if r.phase_caption else ""
    note = f'<p class="dim">{_e(r.typical_note)}</p>' if r.typical_note else ""
    return (f'<p class="dim">{_e(r.phase_title)}</p>'
            f'<svg viewBox="0 0 1000 34" role="img" aria-label="{_e(r.phase_bar_label)}">'
            f"<title>{_e(r.phase_title)}</title>{''.join(rects)}</svg><table>{head}{''.join(rows)}{total}</table>"
            + caption + note)


def _group(g: ch.ChartGroup) -> str:
    if g.not_measured is not None:
        return _nm(g.not_measured)
    return "".join(_line_chart(c) for c in g.charts) + (f'<p class="dim">{_e(g.caption)}</p>' if g.caption else "")


def _ranks(r: Report, ranks: list) -> str:
    out = ""
    v = r.ranks
    if v is not None:
        head = "".join(f"<th class=n>{_e(h)}</th>" for h in v.header)
        rows = "".join("<tr>" + "".join(f"<td class=n>{_e(c)}</td>" for c in row) + "</tr>" for row in v.rows)
        out += (f"<p><b>{_e(v.title)}</b></p><table><tr>{head}</tr>{rows}</table><p class=\"dim\">{_e(v.caption)}</p>"
                + "".join(f"<p>{_e(line)}</p>" for line in v.lines)
                + "".join(f'<p class="nm">{_e(line)}</p>' for line in v.problems))
    bad = ' class="bad"'
    t = ch.rank_table(ranks)
    where = "".join(f"<tr><td class=n>{_e(w.rank)}</td><td>{_e(w.host)}</td><td class=n>{_e(w.local_rank)}</td>"
                    f"<td{'' if w.ok else bad}>{_e(w.status)}</td></tr>" for w in t.rows)
    head = "".join(f"<th{cls}>{_e(name)}</th>" for name, cls in zip(t.header, RANK_CELLS))
    out += f"<table><tr>{head}</tr>" + where + "</table>"
    return out + _line_chart(ch.rank_chart(ranks))


def _notes(r: Report) -> str:
    lines = r.notes + r.attribution
    return "<ul>" + "".join(f"<li>{_e(ln)}</li>" for ln in lines) + "</ul>" if lines else ""


def render_html(profile: Profile, analysis) -> str:
    """The whole report page of (profile, analysis)."""
    p = profile
    r = build_report(p, analysis)
    h = r.headings
    ranks = checked_ranks(p)
    title = r.title

    def section(name: str) -> str:
        return f"<h2>{_e(name)}</h2>"

    parts = [f"<h1>{_e(title)}</h1>", _header(r), _headline(r),
             section(h.findings_section), _findings(r),
             section(h.corrected_short), _corrected(r),
             section(h.phases_section), _phases(r),
             section(h.steps_section), _group(ch.step_chart(p)),
             section(h.gpu_section), _group(ch.gpu_charts(p)),
             section(h.host_section), _group(ch.host_charts(p))]
    if ranks:
        parts += [section(h.ranks_section), _ranks(r, ranks)]
    parts += [section(h.mfu), f"<p>{_e(r.mfu)}</p>"]
    notes = _notes(r)
    if notes:
        parts += [section(h.notes_section), notes]
    parts.append(f'<p class="dim">{_e(r.footer)}</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="generator" content="gpuprof">'  # how gpuprof knows its own file (files.KINDS)
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(parts) + "\n</body></html>\n")
