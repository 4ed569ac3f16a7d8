"""Formatting shared by the renderers: the figures in words (gpuprof.units), a finding's evidence
in words when the rule wrote no `because` sentence, and tables that fit the terminal."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuprof.units import (  # noqa: F401 - re-exported for the renderers
    NM,
    bytes_per_s,
    count,
    flops_rate,
    gib,
    nbytes,
    number,
    pct,
    seconds,
    times,
    tokens,
)

# Evidence keys that name the step itself: the report prints the step once, labelled with its
# statistic, so a finding's evidence never prints it a second time (possibly as another statistic).
STEP_KEYS = ("step_s", "mean_step_s")


def _label(key: str, suffixes: tuple[str, ...]) -> str:
    for suffix in suffixes:
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key.replace("_", " ").strip()


def evidence_value(key: str, value) -> str | None:
    """One evidence figure in words, its unit inferred from the key (None: nothing to show).

    `_s` seconds, `_bytes_s` a rate, `_bytes` bytes, `share`/`_frac`/`mfu` a fraction as a
    percentage, `_pct` already a percentage, `ratio`/`times_`/`headroom` a ratio (2 decimals ×),
    `_tflops` a compute rate; anything else three significant figures."""
    if value is None:
        return None  # not measured: the rule had no figure
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        parts = [f"{k} {evidence_value(key, v)}" for k, v in value.items() if evidence_value(key, v) is not None]
        return ", ".join(parts) or None
    if isinstance(value, (list, tuple)):
        parts = [evidence_value(key, v) for v in value]
        return ", ".join(p for p in parts if p) or None
    if not isinstance(value, (int, float)):
        return str(value)
    k = key.lower()
    if k.endswith(("_bytes_s", "bytes_per_s")):
        return bytes_per_s(value)
    if k.endswith(("_gb_s", "_mb_s")):
        return bytes_per_s(value * (1e9 if k.endswith("_gb_s") else 1e6))
    if k.endswith("gflop_s"):
        return flops_rate(value / 1e3)
    if k.endswith("_per_s"):
        return f"{number(value)}/s"
    if k.endswith("_ms"):
        return seconds(value / 1e3)
    if k.endswith("_s"):
        return seconds(value)
    if k.endswith("bytes"):
        return nbytes(value)
    if k.endswith("_pct"):
        return f"{value:.1f}%"
    if k.endswith(("share", "_frac", "_fraction")) or k == "used" or k.startswith("mfu"):
        return pct(value)
    if "ratio" in k or k.startswith("times_") or "headroom" in k or k.endswith("_x"):
        return times(value)
    if k.endswith("tflops"):
        return flops_rate(value)
    return number(value)


def evidence_words(evidence: dict) -> str:
    """A finding's evidence dict as a sentence of labelled figures with units, for a finding
    whose rule wrote no `because` (an older saved profile, a new rule): "data exposed 1.20 s;
    share of the step 26.8%; timeline host". Never `key=value`, never a bare float."""
    parts = []
    for key, value in (evidence or {}).items():
        if key in STEP_KEYS:
            continue
        text = evidence_value(key, value)
        if text is None:
            continue
        if key == "share":
            label = "share of the step"
        else:
            label = _label(key, ("_bytes_s", "_gb_s", "_mb_s", "_gflop_s", "_bytes", "_pct", "_ms", "_s"))
        parts.append(f"{label} {text}")
    return "; ".join(parts)


class FitTable:
    """A table whose columns are never squeezed: every cell keeps its text on one line. When
    the columns do not fit the width, they are split into several tables, each repeating the
    first (label) column, so no cell is truncated ("backwa…") or wrapped ("1.07 / GB")."""

    def __init__(self, headers: list[tuple[str, str]], rows: list[list], **table_kwargs):
        self.headers = headers  # (header, justify)
        self.rows = rows
        self.kwargs = table_kwargs

    def _table(self, cols: list[int]) -> Table:
        t = Table(**self.kwargs)
        for i in cols:
            header, justify = self.headers[i]
            t.add_column(header, justify=justify, no_wrap=True)
        for row in self.rows:
            t.add_row(*[row[i] for i in cols])
        return t

    def _need(self, console: Console, options: ConsoleOptions, cols: list[int]) -> int:
        """The width a table of these columns needs on one line per cell (measured unclamped)."""
        return Measurement.get(console, options.update(width=10_000), self._table(cols)).maximum

    def _groups(self, console: Console, options: ConsoleOptions) -> list[list[int]]:
        width = options.max_width
        groups: list[list[int]] = []
        current = [0]
        for i in range(1, len(self.headers)):
            trial = current + [i]
            if len(current) > 1 and self._need(console, options, trial) > width:
                groups.append(current)
                current = [0, i]
            else:
                current = trial
        groups.append(current)
        return groups

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for i, group in enumerate(self._groups(console, options)):
            if i:
                yield Text("")  # a continuation: the next columns, under the first ones
            yield self._table(group)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        need = max(self._need(console, options, g) for g in self._groups(console, options))
        return Measurement(need, need).clamp(max_width=options.max_width)
