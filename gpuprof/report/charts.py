"""The charts of the HTML page, decided once: which series, their titles, labels, units, scales,
shaded windows and captions, or the "not measured" line that stands in for a chart. The HTML
renderer only draws them (axes, colours, SVG).

Figures come from the Profile's own measurements: step times on the report's timeline (GPU
events when the run had them, else host wall time), NVML and psutil timelines, each rank's steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import Profile, rank_profile
from gpuprof.units import NM

# What a series' y values are: the renderer picks the number format from it.
SECONDS, PERCENT, BYTES, CORES = "seconds", "percent", "bytes", "cores"


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


def rank_rows(ranks: list[dict]) -> tuple[RankRow, ...]:
    """Where each rank ran and how it ended (the entries' own strings)."""
    out = []
    for e in sorted(ranks, key=lambda e: e.get("rank", 0)):
        local = e.get("local_rank")
        out.append(RankRow(e.get("rank"), e.get("host") or NM, NM if local is None else str(local),
                           e.get("status") or "?", e.get("status") == "ok"))
    return tuple(out)


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
