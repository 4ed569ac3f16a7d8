"""bench-disk output: the terminal report (rich; its lines, cells and tones from gpuprof.report.disk), the JSON
text, the progress bar (stderr). Layout only."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Iterator

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuprof.report.details import BAD, GOOD, WARN
from gpuprof.report.disk import PROGRESS_START, REQUIREMENT, WARNING, DiskTable, DiskView, disk_view

LABEL = 11  # the header's and the requirement's labels, aligned
_COLOUR = {GOOD: "green", WARN: "yellow", BAD: "red"}


def _table(d: DiskTable) -> Table:
    t = Table(title=escape(d.title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              title_style="bold", collapse_padding=True, caption_justify="left")
    for i, col in enumerate(d.columns):
        t.add_column(escape(col), justify="left" if i == 0 else "right", no_wrap=True)
    for row in d.rows:
        t.add_row(*(escape(c) for c in row))
    t.caption = escape(d.caption) if d.caption else d.caption
    return t


def print_view(v: DiskView, console: Console) -> None:
    """Every text from the view is escaped: a path or a filesystem's name is never read as markup."""
    console.print(f"[bold]{escape(v.title)}[/bold] {escape(v.subject)}", highlight=False)
    for fact in v.facts:
        console.print(escape(f"{fact.label:<{LABEL}} {fact.text}"), highlight=False)
    for w in v.warnings:
        console.print(f"[yellow]{escape(WARNING)}[/yellow] {escape(w)}", highlight=False)
    for t in v.tables:
        console.print(_table(t))
    for i, verdict in enumerate(v.requirement):
        label = f"[bold]{escape(REQUIREMENT):<{LABEL}}[/bold] " if i == 0 else " " * (LABEL + 1)
        colour = _COLOUR.get(verdict.tone, "red")
        console.print(f"{label}{escape(verdict.lead)}[{colour}]{escape(verdict.text)}[/{colour}]", highlight=False)
    console.print(escape(v.took), style="dim", highlight=False)


def print_report(r: dict, console: Console | None = None) -> None:
    """The bench-disk terminal report (gpuprof.report.disk decides every line and cell)."""
    print_view(disk_view(r), console or Console())


def _tidy(x):
    """Six significant digits: measurement noise is far above that."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _tidy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_tidy(v) for v in x]
    return x


def to_json(r: dict) -> str:
    """The --json document (keys documented in docs/bench-disk.md)."""
    return json.dumps(_tidy(r), indent=2, ensure_ascii=False)


@contextlib.contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator:
    """Yield a progress callback (what, done, total); a rich bar on stderr if it is a TTY."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield None
        return
    prog = Progress(TextColumn("{task.description:<28}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)
    task = prog.add_task(escape(PROGRESS_START), total=1)
    with prog:
        yield lambda what, done, total: prog.update(task, description=escape(what), completed=done,
                                                    total=total)
