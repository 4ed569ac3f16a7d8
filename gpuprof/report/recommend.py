"""`gpuprof recommend`'s terminal report decided once, from its Recommendation (gpuprof.recommend.plan)
and, under --measure, its SweepResult (gpuprof.recommend.sweep): the header's facts (the token target
and its window, the model and its parameters, the setup, where the capacity comes from and the margin
kept, the throughput model or its absence, the sweep's timings), the candidates table (headings, the
rows shown and every cell: memory as a share of the capacity, whether it fits, the step with the
model's range where that is wider than RANGE_SHOWN of it, tokens/s), the verdict (the winner, or why
nothing fits) with the lines under it (why, the current config against it, the FLOP floor, the flags,
the file written), the winner's memory breakdown (its terms, the total, capacity − margin = usable
and the bytes spare or short) and the notes, with their tones.

Memory is in decimal units (units.nbytes), as --memory-gb and the datasheets ("141 GB") state it;
a cell with no figure (no capacity, no throughput model) is units.EMPTY, and whether a candidate
fits when the capacity is unknown reads units.NM. gpuprof.render.recommend lays the view out;
nothing here prints."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.dims import GPTConfig, param_count
from gpuprof.recommend.config import flags
from gpuprof.recommend.memory import MemoryEstimate
from gpuprof.recommend.plan import Candidate, Recommendation, token_window
from gpuprof.recommend.sweep import SweepResult
from gpuprof.recommend.tokens import describe_tokens
from gpuprof.units import EMPTY, NM, count, nbytes, seconds

# A text's tone: what it is to the reader. The renderer picks the style.
PLAIN = ""
HEADING = "heading"  # a title, a table's headings
GOOD = "good"  # fits
BAD = "bad"  # does not fit; nothing fits
BEST = "best"  # the winner: its row and the line naming it
CURRENT = "current"  # the user's present config, set apart from the candidates

RANGE_SHOWN = 0.02  # a step's range is shown when it spans more than this share of the step
NOTE = "note:"
_SOURCE = {"flops": "FLOP estimate", "profile": "from profile", "measured": "measured"}


@dataclass(frozen=True)
class Line:
    text: str
    tone: str = PLAIN


@dataclass(frozen=True)
class Fact:
    """A header line: its label (the renderer aligns them) and what it says."""

    label: str
    text: str


@dataclass(frozen=True)
class Column:
    heading: str
    words: bool = False  # holds words (left-aligned), not figures


Cell = Line  # a table cell is a text and its tone, as a line is


@dataclass(frozen=True)
class Row:
    """A candidate (or the current config): its mark, then one cell per figure column."""

    cells: tuple[Cell, ...]
    tone: str = PLAIN

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(c.text for c in self.cells)


@dataclass(frozen=True)
class BreakdownView:
    """One candidate's memory: the terms adding up to its total, and the verdict against the
    usable capacity ("" when the capacity is unknown)."""

    title: Line
    rows: tuple[tuple[str, str, str], ...]  # (term, bytes, detail), the total last
    verdict: str


@dataclass(frozen=True)
class RecommendView:
    title: Line
    facts: tuple[Fact, ...]
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]  # the candidates shown, in rank order, then the current config
    hidden: str  # how many candidates only the JSON lists; "" when none
    verdict: Line  # the winner, or why nothing fits
    details: tuple[str, ...]  # under the verdict: why, vs current, FLOP floor, flags, written
    breakdown: BreakdownView | None  # the winner's; None when nothing fits
    notes: tuple[str, ...]


# -- figures: each from the Recommendation by the formula its name states --------------------
def params_millions(m: GPTConfig) -> float:
    """The model's parameters (position embeddings included), in millions."""
    return param_count(m, False) / 1e6


def share_of_capacity(total_bytes: int, capacity_bytes: int | None) -> float | None:
    """A candidate's modeled memory ÷ the capacity (None when the capacity is unknown)."""
    return total_bytes / capacity_bytes if capacity_bytes else None


def usable_bytes(mem: MemoryEstimate) -> int | None:
    """Capacity − margin: what a configuration must fit in (None when the capacity is unknown)."""
    return None if mem.capacity_bytes is None else mem.capacity_bytes - mem.margin_bytes


def spare_bytes(mem: MemoryEstimate) -> int | None:
    """Usable − total: the headroom when it fits, negative (the shortfall) when it does not."""
    usable = usable_bytes(mem)
    return None if usable is None else usable - mem.total_bytes


def range_shown(c: Candidate) -> bool:
    """Whether the step's (fast, slow) range spans more than RANGE_SHOWN of the step."""
    return bool(c.step_s and c.step_s_range
                and c.step_s_range[1] - c.step_s_range[0] > RANGE_SHOWN * c.step_s)


def measured(rec: Recommendation) -> bool:
    """Whether the step times come from a measurement (a profile or --measure), not FLOPs."""
    return rec.throughput is not None and rec.throughput.source != "flops"


# -- words ------------------------------------------------------------------------------------
def _gb(n: int | None) -> str:
    return EMPTY if n is None else nbytes(n)


def _secs(s: float | None) -> str:
    return EMPTY if s is None else seconds(s)


def _rate(x: float | None) -> str:
    return EMPTY if x is None else count(x)


def _share(x: float | None) -> str:
    return EMPTY if x is None else f"{x:.0%}"


def _fits(c: Candidate) -> Cell:
    if c.fits is None:
        return Cell(NM)
    return Cell("yes", GOOD) if c.fits else Cell("NO", BAD)


def _step(c: Candidate) -> str:
    if c.step_s is None:
        return EMPTY
    text = _secs(c.step_s)
    if range_shown(c):
        text += f" ({_secs(c.step_s_range[0])}-{_secs(c.step_s_range[1])})"
    return text


def title(rec: Recommendation) -> Line:
    lo, hi = token_window(rec.target_tokens, rec.tolerance)
    return Line(f"gpuprof recommend: {describe_tokens(rec.target_tokens)} tokens per optimizer step "
                f"(±{rec.tolerance:.0%}: {lo:,}-{hi:,})", HEADING)


def facts(rec: Recommendation, sweep: SweepResult | None = None) -> tuple[Fact, ...]:
    m = rec.model
    setup = [rec.dtype, "compile" if rec.compile else "no compile",
             "flash attention" if rec.flash else "math attention",
             "activation checkpointing" if rec.checkpointing else "no checkpointing",
             f"{rec.world_size} GPU{'s' if rec.world_size > 1 else ''}"]
    src = rec.capacity_source or (rec.gpu.name if rec.gpu else "capacity")
    out = [Fact("model", f"{m.n_layer} layers, {m.n_head} heads, n_embd {m.n_embd}, vocab "
                         f"{m.vocab_size:,}, block {m.block_size:,}: {params_millions(m):,.1f}M params"),
           Fact("setup", ", ".join(setup)),
           Fact("memory", f"{_gb(rec.capacity_bytes)} from {src}, {rec.margin:.0%} kept as margin")]
    if rec.throughput is not None:
        how = _SOURCE.get(rec.throughput.source, rec.throughput.source)
        out.append(Fact("speed", f"{how}: {rec.throughput.note}"))
    else:
        out.append(Fact("speed", "no throughput model (no GPU peak, profile or measurement): ranked "
                                 "by fewest micro-steps"))
    if sweep is not None:
        pts = ", ".join(f"B={p.batch_size}: {_secs(p.seconds) if p.seconds else p.error}"
                        for p in sweep.points)
        out.append(Fact("measure", f"{sweep.device}: {pts}; stopped: {sweep.stopped}"))
    return tuple(out)


def columns(rec: Recommendation) -> tuple[Column, ...]:
    step = "step" + ("" if measured(rec) else " (est.)")
    return (Column("", True), Column("batch_size"), Column("accum"), Column("tokens/step"),
            Column("memory"), Column("of capacity"), Column("fits", True), Column(step),
            Column("tokens/s"))


def row(rec: Recommendation, c: Candidate, mark: str, tone: str = PLAIN) -> Row:
    """One configuration's cells: its mark, B, A, tokens, memory, share of capacity, fits, step,
    tokens/s."""
    cells = (Cell(mark), Cell(str(c.batch_size)), Cell(str(c.gradient_accumulation_steps)),
             Cell(describe_tokens(c.tokens)), Cell(_gb(c.memory.total_bytes)),
             Cell(_share(share_of_capacity(c.memory.total_bytes, rec.capacity_bytes))),
             _fits(c), Cell(_step(c)), Cell(_rate(c.tokens_per_s)))
    return Row(cells, tone)


def rows(rec: Recommendation) -> tuple[Row, ...]:
    """The candidates worth showing (Recommendation.shown), marked by rank or as the winner, then
    the current config."""
    out = [row(rec, c, "★ best", BEST) if c is rec.best
           else row(rec, c, f"#{rec.candidates.index(c) + 1}") for c in rec.shown()]
    if rec.current is not None:
        out.append(row(rec, rec.current, "current", CURRENT))
    return tuple(out)


def hidden(rec: Recommendation) -> str:
    n = len(rec.candidates) - len(rec.shown())
    return f"({n} more candidates in --json)" if n > 0 else ""


def verdict(rec: Recommendation) -> Line:
    b = rec.best
    if b is None:
        return Line(f"No configuration fits: {rec.reason}", BAD)
    return Line(f"Recommended: batch_size={b.batch_size}, gradient_accumulation_steps="
                f"{b.gradient_accumulation_steps}", BEST)


def details(rec: Recommendation, written: str | None = None) -> tuple[str, ...]:
    """The lines under the winner: why, the current config against it (it does not fit, or
    its step, tokens/s and memory → the winner's), the FLOP floor, the flags, the file written."""
    b = rec.best
    if b is None:
        return ()
    out = [f"why: {rec.reason}"]
    c = rec.current
    if c is not None and c.fits is False:
        out.append(f"vs current batch_size={c.batch_size} × {c.gradient_accumulation_steps}: "
                   f"does not fit ({_gb(c.memory.total_bytes)} needed, "
                   f"{_gb(usable_bytes(c.memory))} usable)")
    elif c is not None and c.step_s and b.step_s:
        out.append(f"vs current batch_size={c.batch_size} × {c.gradient_accumulation_steps}: "
                   f"step {_secs(c.step_s)} → {_secs(b.step_s)}, tokens/s "
                   f"{_rate(c.tokens_per_s)} → {_rate(b.tokens_per_s)}, memory "
                   f"{_gb(c.memory.total_bytes)} → {_gb(b.memory.total_bytes)}")
    floor = rec.flop_floor_s(b)
    if floor:
        out.append(f"FLOP floor: {_secs(floor)} per step at 100% of the GPU's dense peak; "
                   f"no configuration can be faster")
    out.append(f"flags: {flags(rec.overrides())}")
    if written:
        out.append(f"wrote {written}")
    return tuple(out)


def breakdown_view(c: Candidate) -> BreakdownView:
    """The memory terms of one candidate, adding up to its total, and whether that fits."""
    mem = c.memory
    terms = tuple((t.name, _gb(t.bytes), t.detail) for t in mem.terms)
    text = ""
    if mem.capacity_bytes:
        usable, spare = usable_bytes(mem), spare_bytes(mem)
        fits = f"fits, {_gb(spare)} spare" if mem.fits else f"does NOT fit, {_gb(-spare)} short"
        text = (f"capacity {_gb(mem.capacity_bytes)} − margin {_gb(mem.margin_bytes)} = "
                f"{_gb(usable)} usable → {fits}")
    return BreakdownView(Line(f"Memory for batch_size={c.batch_size} (peak at the {mem.moment}):", HEADING),
                         terms + (("total", _gb(mem.total_bytes), ""),), text)


def recommend_view(rec: Recommendation, *, written: str | None = None,
                   sweep: SweepResult | None = None) -> RecommendView:
    """The report of one Recommendation (`written`: the corrected config's path, if one was
    written; `sweep`: the --measure timings)."""
    return RecommendView(title(rec), facts(rec, sweep), columns(rec), rows(rec), hidden(rec),
                         verdict(rec), details(rec, written),
                         None if rec.best is None else breakdown_view(rec.best), tuple(rec.notes))
