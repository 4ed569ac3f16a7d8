"""`gpuprof compare` as a terminal report (rich) and as JSON. Every cell and line comes from the
report model (gpuprof.report.compare); this module only places them: tables with no-wrap cells,
prose lines that wrap at spaces, readable at 80 columns."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuprof.analysis.compare import Comparison
from gpuprof.report.compare import Rows, compare_view


def table(rows: Rows) -> Table:
    """A table whose first column (left) names the row and the others (right) hold figures."""
    t = Table()
    last = len(rows.columns) - 1
    for i, name in enumerate(rows.columns):
        words = i < rows.text_columns or (rows.last_is_text and i == last)
        t.add_column(name, justify="left" if words else "right", no_wrap=True)
    for row in rows.rows:
        t.add_row(*row)
    return t


def render_comparison(c: Comparison, console: Console) -> None:
    """Print the comparison as the report model words it."""
    v = compare_view(c)

    def line(text: str, style: str | None = None) -> None:
        console.print(Text(text, style=style or ""), highlight=False)

    head = Text()
    head.append(v.title, style="bold")
    head.append(f"  {v.names}")
    console.print(head, highlight=False)
    line(v.basis_note, "yellow" if v.per_token else "dim")
    console.print(table(v.summary))
    for text in v.not_measured:
        line(text, "dim")
    if v.step_change:
        line(v.step_change, "dim")
    line(v.phases_heading, "bold")
    console.print(table(v.phases))
    if v.outcomes is not None:
        line(v.outcomes_heading, "bold")
        console.print(table(v.outcomes))
        for text in v.outcome_lines:
            line(text, "dim")
    if v.unpredicted:
        line(v.unpredicted)
    if v.no_findings:
        line(v.no_findings, "dim")
    if v.new_heading:
        line(v.new_heading, "bold")
        for text in v.new_lines:
            line(text)
    line(v.config_heading, "bold" if v.config_changed else "dim")
    for text in v.config_lines:
        line(text)
    for text in v.notes:
        line(text, "yellow")


def comparison_json(c: Comparison, gate: dict | None = None) -> str:
    """The comparison as JSON (analysis.compare.Comparison.to_dict), plus the CI gate when set."""
    d = c.to_dict()
    if gate is not None:
        d["gate"] = gate
    return json.dumps(d, indent=2)
