"""Render a Recommendation: a terminal report (rich) or JSON. Nothing here computes a figure."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuprof.recommend.config import flags
from gpuprof.recommend.plan import Candidate, Recommendation, token_window
from gpuprof.recommend.tokens import describe_tokens
from gpuprof.dims import param_count
from gpuprof.units import EMPTY, count, nbytes, seconds



# The report's words for each figure (gpuprof.units), units.EMPTY where a cell has none. Memory in
# recommend is decimal GB, as --memory-gb and the datasheets ("141 GB") state it.
def _gb(n: int | None) -> str:
    return EMPTY if n is None else nbytes(n)


def _secs(s: float | None) -> str:
    return EMPTY if s is None else seconds(s)


def _rate(x: float | None) -> str:
    return EMPTY if x is None else count(x)


def _fits(c: Candidate) -> Text:
    if c.fits is None:
        return Text("?")
    return Text("yes", style="green") if c.fits else Text("NO", style="bold red")


def _step(c: Candidate, measured: bool) -> str:
    if c.step_s is None:
        return EMPTY
    text = _secs(c.step_s)
    if c.step_s_range and c.step_s_range[1] - c.step_s_range[0] > 0.02 * c.step_s:
        text += f" ({_secs(c.step_s_range[0])}-{_secs(c.step_s_range[1])})"
    return text


def render_text(rec: Recommendation, *, color: bool = False, width: int = 120,
                written: str | None = None, sweep=None) -> str:
    """The terminal report as a string (ANSI colors only when color=True)."""
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=color, color_system="standard" if color else None,
                  width=width, highlight=False, soft_wrap=False)
    m = rec.model
    lo, hi = token_window(rec.target_tokens, rec.tolerance)
    con.print(Text(f"gpuprof recommend: {describe_tokens(rec.target_tokens)} tokens per "
                   f"optimizer step (±{rec.tolerance:.0%}: {lo:,}-{hi:,})", style="bold"))
    con.print(f"model   {m.n_layer} layers, {m.n_head} heads, n_embd {m.n_embd}, vocab "
              f"{m.vocab_size:,}, block {m.block_size:,}: {param_count(m, False) / 1e6:,.1f}M params")
    setup = [rec.dtype, "compile" if rec.compile else "no compile",
             "flash attention" if rec.flash else "math attention",
             "activation checkpointing" if rec.checkpointing else "no checkpointing",
             f"{rec.world_size} GPU{'s' if rec.world_size > 1 else ''}"]
    con.print("setup   " + ", ".join(setup))
    src = rec.capacity_source or (rec.gpu.name if rec.gpu else "capacity")
    con.print(f"memory  {_gb(rec.capacity_bytes)} from {src}, {rec.margin:.0%} kept as margin")
    if rec.throughput is not None:
        src = {"flops": "FLOP estimate", "profile": "from profile",
               "measured": "measured"}.get(rec.throughput.source, rec.throughput.source)
        con.print(f"speed   {src}: {rec.throughput.note}")
    else:
        con.print("speed   no throughput model (no GPU peak, profile or measurement): ranked by "
                  "fewest micro-steps")
    if sweep is not None:
        pts = ", ".join(f"B={p.batch_size}: {_secs(p.seconds) if p.seconds else p.error}"
                        for p in sweep.points)
        con.print(f"measure {sweep.device}: {pts}; stopped: {sweep.stopped}")
    con.print()

    measured = rec.throughput is not None and rec.throughput.source != "flops"
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col, just in [("", "left"), ("batch_size", "right"), ("accum", "right"),
                      ("tokens/step", "right"), ("memory", "right"), ("of capacity", "right"),
                      ("fits", "left"), ("step" + ("" if measured else " (est.)"), "right"),
                      ("tokens/s", "right")]:
        table.add_column(col, justify=just, no_wrap=True)
    rows = rec.shown()
    for c in rows:
        mark = "★ best" if c is rec.best else f"#{rec.candidates.index(c) + 1}"
        style = "bold green" if c is rec.best else None
        table.add_row(mark, str(c.batch_size), str(c.gradient_accumulation_steps),
                      describe_tokens(c.tokens), _gb(c.memory.total_bytes),
                      f"{c.memory.total_bytes / rec.capacity_bytes:.0%}" if rec.capacity_bytes else EMPTY,
                      _fits(c), _step(c, measured), _rate(c.tokens_per_s), style=style)
    if rec.current is not None:
        c = rec.current
        table.add_row("current", str(c.batch_size), str(c.gradient_accumulation_steps),
                      describe_tokens(c.tokens), _gb(c.memory.total_bytes),
                      f"{c.memory.total_bytes / rec.capacity_bytes:.0%}" if rec.capacity_bytes else EMPTY,
                      _fits(c), _step(c, measured), _rate(c.tokens_per_s), style="italic")
    con.print(table)
    hidden = len(rec.candidates) - len(rows)
    if hidden > 0:
        con.print(f"({hidden} more candidates in --json)")
    con.print()

    if rec.best is None:
        con.print(Text(f"No configuration fits: {rec.reason}", style="bold red"))
    else:
        b = rec.best
        con.print(Text(f"Recommended: batch_size={b.batch_size}, gradient_accumulation_steps="
                       f"{b.gradient_accumulation_steps}", style="bold green"))
        con.print(f"  why: {rec.reason}")
        c = rec.current
        if c is not None and c.fits is False:
            con.print(f"  vs current batch_size={c.batch_size} × {c.gradient_accumulation_steps}: "
                      f"does not fit ({_gb(c.memory.total_bytes)} needed, "
                      f"{_gb(c.memory.capacity_bytes - c.memory.margin_bytes)} usable)")
        elif c is not None and c.step_s and b.step_s:
            con.print(f"  vs current batch_size={c.batch_size} × {c.gradient_accumulation_steps}: "
                      f"step {_secs(c.step_s)} → {_secs(b.step_s)}, tokens/s "
                      f"{_rate(c.tokens_per_s)} → {_rate(b.tokens_per_s)}, memory "
                      f"{_gb(c.memory.total_bytes)} → {_gb(b.memory.total_bytes)}")
        floor = rec.flop_floor_s(b)
        if floor:
            con.print(f"  FLOP floor: {_secs(floor)} per step at 100% of the GPU's dense peak; "
                      f"no configuration can be faster")
        con.print(f"  flags: {flags(rec.overrides())}")
        if written:
            con.print(f"  wrote {written}")
        con.print()
        con.print(render_breakdown(rec, b, width=width, color=color), end="")
    if rec.notes:
        con.print()
        for n in rec.notes:
            con.print(f"note: {n}")
    return _strip(buf.getvalue())


def _strip(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def render_breakdown(rec: Recommendation, c: Candidate, *, width: int = 120,
                     color: bool = False) -> str:
    """The memory terms of one candidate, adding up to its total."""
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=color, color_system="standard" if color else None,
                  width=width, highlight=False)
    mem = c.memory
    con.print(Text(f"Memory for batch_size={c.batch_size} (peak at the {mem.moment}):",
                   style="bold"))
    table = Table(show_edge=False, pad_edge=False, box=None, show_header=False)
    table.add_column(justify="left", no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(justify="left")
    for t in mem.terms:
        table.add_row(f"  {t.name}", _gb(t.bytes), t.detail)
    table.add_row("  total", _gb(mem.total_bytes), "")
    con.print(table)
    if mem.capacity_bytes:
        usable = mem.capacity_bytes - mem.margin_bytes
        verdict = (f"fits, {_gb(usable - mem.total_bytes)} spare" if mem.fits
                   else f"does NOT fit, {_gb(mem.total_bytes - usable)} short")
        con.print(f"  capacity {_gb(mem.capacity_bytes)} − margin {_gb(mem.margin_bytes)} = "
                  f"{_gb(usable)} usable → {verdict}")
    return _strip(buf.getvalue())


def render_json(rec: Recommendation, *, written: str | None = None, sweep=None) -> str:
    """The documented JSON (docs/recommend.md): candidates[], best, breakdown, current, …"""
    d = rec.to_dict()
    d["flags"] = flags(rec.overrides()) if rec.best else None
    d["written"] = written
    d["measure"] = sweep.to_dict() if sweep is not None else None
    return json.dumps(d, indent=2)
