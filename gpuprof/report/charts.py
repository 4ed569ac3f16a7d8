"""The charts of the HTML page, decided once: which series, their titles, labels, units, scales,
shaded windows and captions, the axes' ends and every figure written on them, or the "not
measured" line that stands in for a chart; and the table of where each rank ran. The HTML
renderer only draws them (geometry, colours, SVG).

Figures come from the Profile's own measurements: step times on the report's timeline (GPU
events when the run had them, else host wall time), NVML and psutil timelines, each rank's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from gpuprof.profile import Profile, rank_profile
from gpuprof.units import NM, UNKNOWN, finite, gib, seconds

# What a series' y values are: the number format of the y axis and of each bar's figure.
SECONDS, PERCENT, BYTES, CORES = "seconds", "percent", "bytes", "cores"
Y_FORMATS = {SECONDS: seconds, PERCENT: lambda v: f"{v:.0f}%", BYTES: gib, CORES: lambda v: f"{v:.2f}"}
RANK_HEADER = ("rank", "host", "local rank", "status")  # the columns of RankTable's rows, in order


@dataclass(frozen=True)
class Series:
    label: str
    xs: tuple
    ys: tuple
    role: str | None = None  # "warmup" / "measured": drawn in their own colours; None: by position


@dataclass(frozen=True)
class Band:
    """A shaded x range: the warmup or measured steps on a timeline."""

    start: float
    end: float
    label: str
    role: str


@dataclass(frozen=True)
class Chart:
    title: str
    series: tuple[Series, ...]
    y_unit: str
    y_max: float | None = None
    x_label: str = "s since the timer started"
    steps_axis: bool = False  # x is a step index: drawn as bars / whole numbers
    bars: bool = False
    bands: tuple[Band, ...] = ()
    missing: str = ""  # the line shown when no series has a finite point

    def __post_init__(self):
        if not self.missing:
            object.__setattr__(self, "missing", f"{self.title}: {NM}")

    # The axes, decided from the series: their ends and the figures written on them.
    @cached_property
    def points(self) -> tuple[tuple[float, float], ...]:
        """Every finite (x, y) of every series; none: the chart is its `missing` line."""
        return tuple((x, y) for sr in self.series for x, y in zip(sr.xs, sr.ys)
                     if finite(x) is not None and finite(y) is not None)

    @cached_property
    def x_ends(self) -> tuple[float, float]:
        """The first and last x with a point (labelled under the axis)."""
        xs = [x for x, _ in self.points]
        return min(xs), max(xs)

    @cached_property
    def x_span(self) -> tuple[float, float]:
        """The x axis's ends: the points' ends, half a slot wider either side for bars (so the
        first and last bars stay inside the axes), never of zero length."""
        x0, x1 = self.x_ends
        if self.bars:
            x0, x1 = x0 - 0.5, x1 + 0.5
        return x0, (x1 if x1 > x0 else x0 + 1)

    @cached_property
    def y_top(self) -> float:
        """The y axis's top: the chart's own maximum where it has one (100%, the memory), else
        the largest y; 1 where that is not above zero."""
        top = self.y_max if finite(self.y_max) else max(y for _, y in self.points)
        return top if top > 0 else 1.0

    def x_text(self, x: float) -> str:
        """An x figure: a whole step index, else enough digits to tell the axis's two ends apart."""
        if self.steps_axis:
            return f"{x:.0f}"
        x0, x1 = self.x_span
        return f"{x:.{min(3, max(0, 1 - math.floor(math.log10(x1 - x0))))}f}"

    def y_text(self, y: float) -> str:
        return Y_FORMATS[self.y_unit](y)

    @property
    def y_top_text(self) -> str:
        return self.y_text(self.y_top)

    @property
    def y_zero_text(self) -> str:
        return self.y_text(0)

    @property
    def x_end_texts(self) -> tuple[str, str]:
        return self.x_text(self.x_ends[0]), self.x_text(self.x_ends[1])

    def tip(self, label: str, x: float, y: float) -> str:
        """What a bar says when pointed at: its series, its x and its y."""
        return f"{label}: {self.x_text(x)}: {self.y_text(y)}"


@dataclass(frozen=True)
class ChartGroup:
    """Charts of one section, a caption under them, or the line that says they were not measured."""

    charts: tuple[Chart, ...] = ()
    caption: str | None = None
    not_measured: str | None = None


@dataclass(frozen=True)
class RankRow:
    rank: object
    host: str
    local_rank: str
    status: str
    ok: bool


@dataclass(frozen=True)
class RankTable:
    """Where each rank ran and how it ended: the header (RANK_HEADER) and a row per rank."""

    header: tuple[str, ...]
    rows: tuple[RankRow, ...]


def _step_time(st, on_gpu: bool):
    return st.gpu_s if on_gpu else st.wall_s


def step_chart(p: Profile) -> ChartGroup:
    """Every step's time, warmup steps apart (not counted)."""
    if not p.steps:
        return ChartGroup(not_measured=NM)
    on_gpu = p.stats.timeline == "gpu"
    series = [Series("measured steps", tuple(s.index for s in p.steps),
                     tuple(_step_time(s, on_gpu) for s in p.steps), "measured")]
    if p.warmup_steps:
        series.insert(0, Series("warmup steps (not counted)", tuple(s.index for s in p.warmup_steps),
                                tuple(_step_time(s, on_gpu) for s in p.warmup_steps), "warmup"))
    what = "GPU timeline" if on_gpu else "host wall time"
    return ChartGroup((Chart(f"Step time per step ({what})", tuple(series), SECONDS, x_label="step",
                             steps_axis=True, bars=True),))


def _windows(p: Profile) -> tuple[Band, ...]:
    out = []
    for steps, label, role in ((p.warmup_steps, "warmup steps", "warmup"), (p.steps, "measured steps", "measured")):
        if steps:
            out.append(Band(min(s.start_s for s in steps), max(s.start_s + s.wall_s for s in steps), label, role))
    return tuple(out)


def _series(tl: dict, keys: list[tuple[str, str]]) -> tuple[Series, ...]:
    return tuple(Series(label, tuple(tl.get("t_s") or []), tuple(tl.get(k) or [])) for k, label in keys if tl.get(k))


def gpu_charts(p: Profile) -> ChartGroup:
    """NVML's utilisation and memory per GPU over the run."""
    nv = p.sections.nvml
    missing = f"GPU utilization and memory: {NM}"
    if not nv.available:
        why = nv.reason or nv.not_measured
        return ChartGroup(not_measured=missing + (f" ({why})" if why else ""))
    charts = []
    for g in nv.gpus:
        tl = g.timeline or {}
        name = g.name or "GPU"
        charts += [Chart(f"{name}: utilization (NVML)",
                         _series(tl, [("gpu_util_pct", "GPU busy %"), ("mem_util_pct", "memory busy %")]),
                         PERCENT, y_max=100.0, bands=_windows(p)),
                   Chart(f"{name}: memory used (NVML)", _series(tl, [("mem_used_bytes", "used")]), BYTES,
                         y_max=g.memory_total_bytes, bands=_windows(p))]
    return ChartGroup(tuple(charts)) if charts else ChartGroup(not_measured=missing)


def host_charts(p: Profile) -> ChartGroup:
    """psutil's machine CPU and the cores this run and others used."""
    hs = p.sections.host
    if not hs.available:
        why = hs.reason or hs.not_measured
        return ChartGroup(not_measured=f"host CPU: {NM}" + (f" ({why})" if why else ""))
    tl = hs.timeline or {}
    cores = hs.cpu_count
    return ChartGroup(
        (Chart("Host CPU (psutil)", _series(tl, [("cpu_pct", "machine %"), ("cpu_pct_max_core", "busiest core %")]),
               PERCENT, y_max=100.0, bands=_windows(p)),
         Chart(f"CPU cores used (of {cores or NM})",
               _series(tl, [("own_cpu_cores", "this run"), ("others_cpu_cores", "other processes")]),
               CORES, y_max=cores, bands=_windows(p))),
        caption="shaded: warmup steps (sand), measured steps (blue). A sample is a rate over one sampling "
                "interval, drawn at the interval's midpoint.")


def rank_table(ranks: list[dict]) -> RankTable:
    """Where each rank ran and how it ended (the entries' own strings; a status not recorded: UNKNOWN)."""
    out = []
    for e in sorted(ranks, key=lambda e: e.get("rank", 0)):
        local = e.get("local_rank")
        out.append(RankRow(e.get("rank"), e.get("host") or NM, NM if local is None else str(local),
                           e.get("status") or UNKNOWN, e.get("status") == "ok"))
    return RankTable(RANK_HEADER, tuple(out))


def rank_chart(ranks: list[dict]) -> Chart:
    """Each rank's step times, on its own timeline."""
    series = []
    for e in sorted(ranks, key=lambda e: e.get("rank", 0)):
        rp = rank_profile(e) if e.get("profile") is not None else None
        if rp is None or not rp.steps:
            continue
        on_gpu = rp.stats.timeline == "gpu"
        series.append(Series(f"rank {e.get('rank')}", tuple(s.index for s in rp.steps),
                             tuple(_step_time(s, on_gpu) for s in rp.steps)))
    return Chart("Step time per rank (each rank on its own timeline)", tuple(series), SECONDS,
                 x_label="step", steps_axis=True)
