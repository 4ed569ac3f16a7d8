"""A terminal timeline of one typical step: a row per phase on a common time axis, and on CUDA a
GPU row, so the overlap of data loading with the GPU's work shows without leaving the terminal.

The host rows are the step's measured phase spans in the order they ran (StepRecord.extra
["spans"], from the timer). Where a profile has none that agree with its phase totals (an older
profile; a script whose `other` time was partly moved to `data` by sampling), the rows are laid
out in the loop's order per micro-step — the built-in loop's own (forward, then the next batch,
then backward, as nanoGPT), a script's assumed (data, copy, forward, backward) — and the caption
says so. The GPU row is the step's GPU spans from its CUDA events
(StepRecord.extra["gpu_spans"]) where they exist, else laid out from its phase totals. Builds
renderables; never prints."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from gpuprof.profile import Profile, StepRecord
from gpuprof.stats import HOST_ONLY_PHASES, PHASES
from gpuprof.units import seconds

# Within one micro-step, in the order the loop runs them. The built-in loop fetches the next
# batch between forward and backward (nanoGPT's prefetch); its copy to the device is inside it.
MICRO_ORDER = {"builtin": ("forward", "data", "h2d", "backward"),
               "script": ("data", "h2d", "forward", "backward")}
STEP_ORDER = ("eval", "optimizer", "other")  # once per step, after the micro-steps
COLORS = {"data": "yellow", "h2d": "magenta", "forward": "cyan", "backward": "blue", "comm": "bright_red",
          "optimizer": "green", "other": "white", "eval": "red"}
GLYPHS = "░▒▓█"  # the share of a character's time the phase ran: < 25%, < 50%, < 75%, more
IDLE = "·"
MIN_BAR = 10


def typical_step(profile: Profile) -> tuple[StepRecord, int] | None:
    """The median of the typical steps (gpuprof.stats: irregular ones left out) on the stats'
    timeline, the lower middle one for an even count, and its rank in time order (1-based)."""
    stats = profile.stats
    if stats is None:
        return None
    on_gpu = stats.timeline == "gpu"
    typical = set(stats.typical)
    steps = [s for s in profile.steps if s.index in typical] or profile.steps

    def t(s: StepRecord) -> float:
        return s.gpu_s if on_gpu and s.gpu_s is not None else s.wall_s

    ordered = sorted(steps, key=t)
    k = (len(ordered) - 1) // 2
    return ordered[k], k + 1


def layout(phases: dict[str, float], micro_steps: int, mode: str = "builtin") -> list[tuple[str, float, float]]:
    """(phase, start, end) spans of one step: each micro-step phase's total split evenly over the
    micro-steps in the loop's order, then the once-per-step phases. Phases the order does not
    name (a new phase) go before the optimizer."""
    m = max(int(micro_steps or 1), 1)
    micro = MICRO_ORDER.get(mode, MICRO_ORDER["script"])
    known = set(micro) | set(STEP_ORDER)
    extra = [p for p in phases if p not in known]
    per_step = [p for p in STEP_ORDER if p != "optimizer" and p != "other"] + extra + ["optimizer", "other"]
    out, t = [], 0.0
    for _ in range(m):
        for p in micro:
            d = phases.get(p, 0.0) / m
            if d > 0:
                out.append((p, t, t + d))
                t += d
    for p in per_step:
        d = phases.get(p, 0.0)
        if d > 0:
            out.append((p, t, t + d))
            t += d
    return out


def coverage(spans: list[tuple[float, float]], total: float, width: int) -> list[float]:
    """For each of `width` equal cells of [0, total), the fraction of it the spans cover."""
    cells = [0.0] * width
    if total <= 0 or width <= 0:
        return cells
    w = total / width
    for a, b in spans:
        i = max(int(a / w), 0)
        while i < width and i * w < b:
            lo, hi = max(a, i * w), min(b, (i + 1) * w)
            if hi > lo:
                cells[i] += (hi - lo) / w
            i += 1
    return [min(c, 1.0) for c in cells]


def glyph(c: float) -> str:
    if c <= 1e-9:
        return " "
    return GLYPHS[min(int(c * 4), 3)]


class FillBar:
    """A one-line bar that fills the width it is given (a table's expanding column): `draw(width)`
    returns the characters for that width."""

    def __init__(self, draw, style: str):
        self.draw = draw  # width -> str of that length
        self.style = style

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(MIN_BAR, options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        yield Segment(self.draw(width), Style.parse(self.style))
        yield Segment.line()


class _Axis(FillBar):
    def __init__(self, total: float):
        right = seconds(total)

        def draw(width: int) -> str:
            inner = width - 1 - len(right) - 2
            if inner < 1:
                return ("0" + " " * width)[:width]
            return "0 " + "─" * (inner - 1) + "┤ " + right
        super().__init__(draw, "dim")


def step_timeline(profile: Profile) -> Group | None:
    """The timeline of the profile's typical step, with its caption; None without a measured step."""
    picked = typical_step(profile)
    if picked is None:
        return None
    step, rank = picked
    mode = "builtin" if profile.run.get("mode", "builtin") == "builtin" else "script"
    micro = step.micro_steps or profile.stats.micro_steps or 1
    measured = step.measured_spans()  # the host's phase spans in the order they ran
    host = [(p, a, a + d) for p, a, d in measured] if measured else layout(step.phases, micro, mode)
    gpu_measured = step.measured_spans(gpu=True)  # the GPU timeline's spans, from the CUDA events
    gpu = ([(p, a, a + d) for p, a, d in gpu_measured] if gpu_measured
           else layout(step.gpu_phases, micro, mode) if step.gpu_phases else None)
    total = max(step.wall_s, sum(step.phases.values()), step.gpu_s or 0.0, sum((step.gpu_phases or {}).values()))
    if total <= 0 or not host:
        return None
    t = Table.grid(padding=(0, 1), expand=True)
    t.add_column(no_wrap=True)
    t.add_column(ratio=1, no_wrap=True)
    names = [p for p in PHASES if any(s[0] == p for s in host)]
    names += [p for p in dict.fromkeys(s[0] for s in host) if p not in names]
    for name in names:
        spans = [(a, b) for p, a, b in host if p == name]
        t.add_row(Text(name), FillBar(lambda w, spans=spans: "".join(glyph(c) for c in coverage(spans, total, w)),
                                   COLORS.get(name, "white")))
    if gpu:
        busy = [(a, b) for p, a, b in gpu if p not in HOST_ONLY_PHASES]
        idle = [(a, b) for p, a, b in gpu if p in HOST_ONLY_PHASES]

        def gpu_row(w: int) -> str:
            b, i = coverage(busy, total, w), coverage(idle, total, w)
            return "".join(IDLE if ib > bb and ib > 1e-9 else glyph(bb) for bb, ib in zip(b, i))

        t.add_row(Text("GPU", style="bold"), FillBar(gpu_row, "green"))
    t.add_row(Text(""), _Axis(total))
    order = ", ".join(p for p in MICRO_ORDER[mode] if step.phases.get(p))
    n = len(profile.stats.typical) or len(profile.steps)
    which = "the median step" if n % 2 else "the lower of the two middle steps"
    among = f"#{rank} of {n} typical steps by time" if profile.stats.irregular else f"#{rank} of {n} by time"
    if measured:
        how = ("as sampled from outside (py-spy)" if profile.run.get("mode") == "attach" else "as measured")
        caption = (f"One step, {which} ({among}), on one time axis: "
                   f"the host's phase spans {how}, in the order they ran. ")
    else:
        caption = (f"One step, {which} ({among}), on one time axis. "
                   + ("The order is the loop's, not measured" if mode == "builtin" else
                      "The order is assumed (a script's loop is not known), not measured")
                   + f": per micro-step {order}"
                   + (f" (×{micro})" if micro > 1 else "") + ", then the rest; this profile keeps only each "
                   "phase's total per step (older profile, or data time attributed by sampling). ")
    caption += "░▒▓█: the share of each character's time the phase ran."
    if gpu:
        caption += (" GPU: " + ("its phase spans from the CUDA events, in the order they ran, "
                                if gpu_measured else
                                "its phase totals laid out in the loop's order (no GPU spans in this "
                                "profile), ")
                    + f"from the same start; busy where it ran the phases' work, {IDLE} idle while the "
                    "host loaded data or ran loop code.")
    title = Text("A typical step on a time axis", style="bold")
    return Group(title, t, Text(caption, style="dim"))
