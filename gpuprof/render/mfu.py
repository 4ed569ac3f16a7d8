"""Rich renderables for MFU, the samplers and a log analysis. Builds, never prints.

The MFU, log and samplers' panels lay out what gpuprof.report.details decided: rows, lines, tables
and warnings, each line's tone a colour.
"""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.analysis.mfu_results import LogAnalysis, MfuResult
from gpuprof.render.format import FitTable
from gpuprof.report.details import (BAD, GOOD, PLAIN, QUIET, WARN, DetailsView, Line, SamplersView, log_view,
                                    mfu_view, samplers_view)
from gpuprof.sections import Sections


def _kv_table() -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    return t


def _notes(items, style: str = "yellow") -> list[Text]:
    return [Text(f"! {w}", style=style) for w in items or []]


# ------------------------------------------------------------------------------ MFU and logs
_TONE = {BAD: "red", WARN: "yellow", GOOD: "green", QUIET: "dim", PLAIN: ""}


def _line(line: Line) -> Text:
    return Text(line.text, style="bold" if line.heading else _TONE.get(line.tone, ""))


def details_panel(view: DetailsView) -> Panel:
    """A details view (gpuprof.report.details) laid out: its rows as label/figure pairs (a note
    dimmed), its lines, its table, its warnings."""
    t = _kv_table()
    for row in view.rows:
        value = Text(row.value)
        if row.note:
            value.append(f" {row.note}", style="dim")
        value.append(row.after)
        t.add_row(row.label, value)
    parts: list = [t]
    parts += [_line(line) for line in view.lines]
    if view.table_rows:
        parts.append(Text(view.table_caption, style="italic"))
        parts.append(FitTable([(col, "right") for col in view.table_columns], [list(r) for r in view.table_rows],
                              show_edge=False))
    parts += _notes(list(view.warnings))
    return Panel(Group(*parts), title=view.title, expand=False)


def mfu_panel(mfu: MfuResult) -> Panel:
    """The MFU section of a report: FLOPs, peak, both MFUs, the floor, a misreport explained."""
    return details_panel(mfu_view(mfu))


# ------------------------------------------------------------------------------------ samplers
def samplers_panel(measurements: dict) -> Panel:
    """GPU (NVML) and host (psutil) samples, overall and per phase, with each sampler's quality,
    from a measurements dict (section name -> a sampler's own output). A profile's typed sections
    go straight to samplers_view_panel(samplers_view(profile.sections)), as the report does."""
    return samplers_view_panel(samplers_view(Sections.from_measurements(measurements)))


def samplers_view_panel(view: SamplersView) -> Panel:
    """The samplers' view laid out: per sampler a heading, its status, its table (the steps row
    bold; cells never wrap: format.FitTable), its lines and warnings."""
    parts: list = []
    for block in view.blocks:
        parts.append(Text(block.heading, style="bold underline"))
        parts.append(_line(block.status))
        if block.rows:
            first, *rest = block.rows
            rows = [[f"[bold]{first[0]}[/bold]", *first[1:]], *[list(r) for r in rest]]
            headers = [(block.columns[0], "left")] + [(c, "right") for c in block.columns[1:]]
            parts.append(FitTable(headers, rows, show_edge=False, pad_edge=False))
        parts += [_line(line) for line in block.lines]
        parts += _notes(block.warnings)
    return Panel(Group(*parts), title=view.title, expand=False)


def log_analysis_panel(result: LogAnalysis) -> Panel:
    """What a nanoGPT log implies: FLOPs, model size, true MFU, the floor, the verdict."""
    return details_panel(log_view(result))
