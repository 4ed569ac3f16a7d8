"""The terminal report (rich): the Report (gpuprof.report.model) laid out. Only renderers print;
this one prints to the console it is given, and words no figure of its own.

The report reads top to bottom as a reader needs it: the step (its one labelled figure), the
verdict, the irregular steps, the ranked fixes with their saving, change and evidence in words,
the corrected config; then where the time goes (phase table, adding up to the step, and a
timeline of a typical step), MFU in one line and what ran. The details (MFU table, samplers,
user-code attribution) follow only when asked for. Every part fits the console's width without
truncating or breaking a word."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.report.first_screen import FirstScreen, build_first_screen
from gpuprof.report.model import FindingView, Findings, RanksView, Report, build_report, group_findings
from gpuprof.render.timeline import FillBar, timeline_panel


def render_diagnosis(profile, analysis, console: Console, *, details: bool = False) -> None:
    """Print the report of (profile, analysis): its first screen (verdict first, about twenty
    lines), or with details=True the whole report and then the MFU table, the samplers and the
    user-code attribution. An attached run's report keeps its whole layout by default until
    `gpuprof attach` adopts the first screen (its report is another piece of work)."""
    if not details and profile.run.get("mode") != "attach":
        render_first_screen(build_first_screen(profile, analysis), console)
        return
    report = build_report(profile, analysis)
    h = report.headings
    console.print(Text(report.title, style="bold"), Text(f": {report.run_line}"), sep="", highlight=False)
    if not report.has_steps:
        console.print(Panel(what_ran(report), title=h.what_ran, title_align="left"))
        console.print(Text(h.no_steps, style="yellow"))
        return
    console.print(step_line(report))
    if report.script_log:
        console.print(Text(report.script_log))
    if report.noise:
        console.print(Text.assemble((f"{h.noise} ", "bold"), (report.noise, "dim")), highlight=False)
    console.print()
    console.print(findings_view(report))
    if report.corrected is not None:
        console.print(corrected_config_panel(report))
    console.print()
    console.print(phase_table(report))
    if report.timeline is not None:
        console.print(timeline_panel(report.timeline))
    if report.typical_note:
        console.print(Text(report.typical_note, style="dim"))
    console.print(Text.assemble((f"{h.mfu} ", "bold"), report.mfu), highlight=False)
    for line in report.notes:
        console.print(Text(line, style="yellow"))
    console.print(Panel(what_ran(report), title=h.what_ran, title_align="left"))
    if report.ranks is not None:
        console.print(ranks_panel(report.ranks))
    if not details:
        console.print(Text(h.details_hint, style="dim"))
        return
    console.rule(h.details, align="left")
    from gpuprof.render.mfu import mfu_panel, samplers_view_panel
    from gpuprof.report.details import samplers_view

    if analysis.mfu is not None:
        console.print(mfu_panel(analysis.mfu))
    if profile.sections.present:
        console.print(samplers_view_panel(samplers_view(profile.sections)))
    for line in report.attribution:
        console.print(Text(f"  {line}"))


def render_first_screen(fs: FirstScreen, console: Console) -> None:
    """The first screen (report.first_screen): the step, the verdict, the top fixes with their
    saving and change, the phases in one line, the outlier steps, the corrected config, what was
    not measured, a data-parallel run's ranks, and what --details adds."""
    h = fs.headings

    def line(label: str, text: str | None) -> None:
        if text:
            console.print(Text.assemble((f"{label} ", "bold"), text), highlight=False)

    console.print(Text(fs.title, style="bold"), Text(f": {fs.run_line}"), sep="", highlight=False)
    if fs.has_steps:
        console.print(Text.assemble(("step ", "bold"), (fs.step, "bold green"), f" ({fs.step_how}) · {fs.rest}"),
                      highlight=False)
        line(h.verdict, fs.verdict)
        rows = [(h.fields[1], fs.verdict_change, ""), ("note", fs.verdict_note, "dim")]
        if fs.verdict_change or fs.verdict_note:
            console.print(Padding(_fields(rows), (0, 0, 0, len(h.verdict) + 1)))
        for text in fs.corrections:
            line(h.correction, text)
        console.print(Text(h.fixes if fs.fixes else h.no_fixes, style="bold underline"))
        for i, fix in enumerate(fs.fixes, 1):
            console.print(Text.assemble(f"{i}. ", (fix.title, "bold")), highlight=False)
            rows = [(h.fields[0], fix.saves, "green" if fix.saves_time else ""), (h.fields[1], fix.change, "")]
            console.print(Padding(_fields(rows), (0, 0, 0, len(f"{i}. "))))
        for text in fs.infos:
            line(h.infos, text)
        line(h.phases, " │ ".join(f"{p} {s}" for p, s in fs.phases))
        line(h.outliers, fs.outliers)
        line(h.corrected, fs.corrected)
    line(h.not_measured, fs.not_measured)
    if fs.ranks is not None:
        console.print(ranks_panel(fs.ranks))
    console.print(Text(fs.more, style="dim"))


def step_line(report: Report) -> Text:
    """The step: the one place its figure is printed, with how it was obtained."""
    text = Text()
    text.append(f"{report.headings.step} ", style="bold")
    text.append(report.step, style="bold green")
    text.append(f" ({report.step_statistic}) · ")
    text.append(report.throughput, style="bold green")
    if report.micro:
        text.append(f" · {report.micro}")
    return text


# ------------------------------------------------------------------------------------ findings
def _fields(rows: list[tuple[str, str, str]]) -> Table:
    """Labelled lines of a finding: the label never wraps, the text wraps at words under itself."""
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True, style="bold")
    t.add_column(ratio=1, overflow="fold")
    for label, text, style in rows:
        if text:
            t.add_row(label, Text(text, style=style))
    return t


def _finding_block(v: FindingView, marker: str, labels: tuple) -> Group:
    head = Table.grid(padding=(0, 1))
    head.add_column(no_wrap=True, justify="right")
    head.add_column(ratio=1, overflow="fold")
    head.add_row(marker, Text(v.title, style="bold"))
    rows = list(zip(labels, (v.saves_line, v.change, v.because, v.note),
                    ("green" if v.saves_time else "", "", "", "dim")))
    return Group(head, Padding(_fields(rows), (0, 0, 0, len(marker) + 1)))


def findings_view(g: Report | Findings) -> Group:
    """The verdict, the irregular steps, the fixes ranked by the time they save (each with its
    saving, the change and the evidence in words), corrections of wrong figures, what else."""
    h = g.headings
    labels = h.finding_fields
    parts: list[RenderableType] = []
    if g.verdict is not None:
        parts.append(_finding_block(g.verdict, h.verdict, labels))
    else:
        parts.append(Text.assemble((f"{h.verdict} ", "bold"), g.verdict_text))
    if g.irregular:
        parts.append(Text(f"\n{h.irregular}", style="bold underline"))
        parts += [_finding_block(v, "•", labels) for v in g.irregular]
    if g.fixes:
        parts.append(Text(f"\n{h.fixes}", style="bold underline"))
        parts += [_finding_block(v, f"{i}.", labels) for i, v in enumerate(g.fixes, 1)]
    else:
        parts.append(Text(f"\n{h.no_fixes}", style="bold"))
    for title, views in ((h.corrections, g.corrections), (h.infos, g.infos)):
        if views:
            parts.append(Text(f"\n{title}", style="bold underline"))
            parts += [_finding_block(v, "•", labels) for v in views]
    return Group(*parts)


def findings_table(findings: list) -> Group:
    """Findings alone (a log analysis, a scenario), laid out as the report lays them out."""
    return findings_view(group_findings(findings))


# ------------------------------------------------------------------------------ where it goes
def phase_table(report: Report) -> Table:
    """Each phase's seconds per typical step and share, a bar that uses the width there is, and
    a total row that is the headline step."""
    h = report.headings
    t = Table(title=report.phase_title, title_justify="left", expand=True, show_footer=True)
    t.add_column(h.phase_columns[0], h.total, no_wrap=True)
    t.add_column(h.phase_columns[1], report.phase_total[0], justify="right", no_wrap=True)
    t.add_column(h.phase_columns[2], report.phase_total[1], justify="right", no_wrap=True)
    t.add_column("", ratio=1, no_wrap=True)
    if report.on_gpu:
        for name in h.gpu_columns:
            t.add_column(name, justify="right", no_wrap=True)
    for r in report.phase_rows:
        bar = FillBar(lambda w, share=r.share: ("█" * int(round(share * w))).ljust(w), "cyan")
        row = [r.phase, r.seconds, r.share_text, bar]
        if report.on_gpu:
            row += [r.host or "", r.idle or ""]
        t.add_row(*row)
    if report.phase_caption:
        t.caption = report.phase_caption
        t.caption_justify = "left"
    return t


# ------------------------------------------------------------------------------------ what ran
def what_ran(report: Report) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for label, text in report.what_ran:  # the run's own strings: text, never console markup
        t.add_row(Text(label), Text(text))
    return t


def corrected_config_panel(report: Report) -> Panel:
    """The merged config fixes as nanoGPT `key = value` lines and the equivalent flags."""
    c = report.corrected
    body = Text()
    for line, was, source in c.lines:
        body.append(line, style="bold")
        body.append((f"   # {was}" if was else "") + f"   ← {source}\n", style="dim")
    body.append(f"{report.headings.flags} ", style="bold")
    body.append(c.flags)
    for conflict in c.conflicts:
        body.append(f"\n{conflict}", style="yellow")
    return Panel(body, title=report.headings.corrected, title_align="left")


def ranks_panel(v: RanksView) -> Panel:
    t = Table(box=None, padding=(0, 1), expand=False)
    for name in v.header:
        t.add_column(name, justify="right", no_wrap=True, min_width=len(name))
    for row in v.rows:
        t.add_row(*row)
    lines: list[RenderableType] = [t, Text(v.caption, style="dim")]
    lines += [Text(line) for line in v.lines]
    lines += [Text(line, style="yellow") for line in v.problems]
    return Panel(Group(*lines), title=v.title, title_align="left")
