"""`gpuprof recommend` output: the terminal report (rich; its lines, cells and tones from
gpuprof.report.recommend) and the JSON text. Layout only."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuprof.recommend.config import flags
from gpuprof.recommend.plan import Candidate, Recommendation
from gpuprof.report.recommend import (BAD, BEST, CURRENT, GOOD, HEADING, NOTE, BreakdownView, Line,
                                      RecommendView, breakdown_view, recommend_view)

LABEL = 7  # the header's labels, aligned
INDENT = "  "  # the lines under the verdict, the breakdown's terms and its verdict
_STYLE = {HEADING: "bold", GOOD: "green", BAD: "bold red", BEST: "bold green", CURRENT: "italic"}


def _style(tone: str) -> str | None:
    return _STYLE.get(tone)


def _line(line: Line) -> Text:
    return Text(line.text, style=_style(line.tone) or "")


def _console(buf: io.StringIO, color: bool, width: int, **kw) -> Console:
    return Console(file=buf, force_terminal=color, color_system="standard" if color else None,
                   width=width, highlight=False, **kw)


def _strip(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def _table(v: RecommendView) -> Table:
    table = Table(show_edge=False, pad_edge=False, box=None, header_style=_style(HEADING))
    for col in v.columns:
        table.add_column(col.heading, justify="left" if col.words else "right", no_wrap=True)
    for r in v.rows:
        table.add_row(*(Text(c.text, style=_style(c.tone) or "") for c in r.cells),
                      style=_style(r.tone))
    return table


def print_view(v: RecommendView, con: Console, *, width: int = 120, color: bool = False) -> None:
    """The report's texts are placed as plain text (never read as markup); the breakdown is
    rendered on its own (render_breakdown's layout) and placed under the verdict."""
    con.print(_line(v.title))
    for fact in v.facts:
        con.print(Text(f"{fact.label:<{LABEL}} {fact.text}"))
    con.print()
    con.print(_table(v))
    if v.hidden:
        con.print(Text(v.hidden))
    con.print()
    con.print(_line(v.verdict))
    for d in v.details:
        con.print(Text(INDENT + d))
    if v.breakdown is not None:
        con.print()
        con.print(Text(_breakdown_text(v.breakdown, width=width, color=color)), end="")
    if v.notes:
        con.print()
        for n in v.notes:
            con.print(Text(f"{NOTE} {n}"))


def render_text(rec: Recommendation, *, color: bool = False, width: int = 120,
                written: str | None = None, sweep=None) -> str:
    """The terminal report as a string (ANSI colors only when color=True)."""
    buf = io.StringIO()
    print_view(recommend_view(rec, written=written, sweep=sweep),
               _console(buf, color, width, soft_wrap=False), width=width, color=color)
    return _strip(buf.getvalue())


def _breakdown_text(b: BreakdownView, *, width: int, color: bool) -> str:
    buf = io.StringIO()
    con = _console(buf, color, width)
    con.print(_line(b.title))
    table = Table(show_edge=False, pad_edge=False, box=None, show_header=False)
    table.add_column(justify="left", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(justify="left")
    for name, size, detail in b.rows:
        table.add_row(Text(INDENT + name), Text(size), Text(detail))
    con.print(table)
    if b.verdict:
        con.print(Text(INDENT + b.verdict))
    return _strip(buf.getvalue())


def render_breakdown(rec: Recommendation, c: Candidate, *, width: int = 120,
                     color: bool = False) -> str:
    """The memory terms of one candidate, adding up to its total."""
    return _breakdown_text(breakdown_view(c), width=width, color=color)


def render_json(rec: Recommendation, *, written: str | None = None, sweep=None) -> str:
    """The documented JSON (docs/recommend.md): candidates[], best, breakdown, current, …"""
    d = rec.to_dict()
    d["flags"] = flags(rec.overrides()) if rec.best else None
    d["written"] = written
    d["measure"] = sweep.to_dict() if sweep is not None else None
    return json.dumps(d, indent=2)
