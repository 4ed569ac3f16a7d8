"""Rich renderables for MFU, the samplers and a log analysis. Builds, never prints.

The MFU and log panels lay out what gpuprof.report.details decided; the samplers' panel reads the
typed sections (gpuprof.sections). A missing figure reads "not measured".
"""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.render.format import FitTable
from gpuprof.report.details import BAD, GOOD, PLAIN, WARN, DetailsView, log_view, mfu_view
from gpuprof.sections import HostSection, SamplerSection, Sections
from gpuprof.units import NM, bytes_per_s, gib, pct


def _num(x, fmt: str = "{:.3g}", unit: str = "") -> str:
    return NM if x is None else fmt.format(x) + unit


def _flops(x) -> str:
    return NM if x is None else f"{x:.3g} FLOP"


def _kv_table() -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    return t


def _notes(items: list[str], style: str = "yellow") -> list[Text]:
    return [Text(f"! {w}", style=style) for w in items or []]


# ------------------------------------------------------------------------------ MFU and logs
_TONE = {BAD: "red", WARN: "yellow", GOOD: "green", PLAIN: ""}


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
    for line in view.lines:
        parts.append(Text(line.text, style="bold" if line.heading else _TONE.get(line.tone, "")))
    if view.table_rows:
        parts.append(Text(view.table_caption, style="italic"))
        parts.append(FitTable([(col, "right") for col in view.table_columns], [list(r) for r in view.table_rows],
                              show_edge=False))
    parts += _notes(list(view.warnings))
    return Panel(Group(*parts), title=view.title, expand=False)


def mfu_panel(mfu: dict) -> Panel:
    """The MFU section of a report: FLOPs, peak, both MFUs, the floor, a misreport explained."""
    return details_panel(mfu_view(mfu))


# ------------------------------------------------------------------------------------ samplers
_NVML_COLS = [("gpu_util_pct", "GPU util", lambda v: _num(v, "{:.0f}", "%")),
              ("sm_clock_share", "SM clock/max", pct),
              ("power_share", "power/limit", pct),
              ("mem_used_bytes", "mem used", gib),
              ("temp_c", "temp", lambda v: _num(v, "{:.0f}", " °C")),
              ("pcie_rx_bytes_s", "PCIe rx", bytes_per_s),
              ("pcie_tx_bytes_s", "PCIe tx", bytes_per_s)]
_HOST_COLS = [("cpu_pct", "CPU", lambda v: _num(v, "{:.0f}", "%")),
              ("cpu_pct_max_core", "max core", lambda v: _num(v, "{:.0f}", "%")),
              ("own_cpu_cores", "this run", lambda v: _num(v, "{:.2f}")),  # cores
              ("others_cpu_cores", "others", lambda v: _num(v, "{:.2f}")),  # cores
              ("rss_bytes", "RSS", gib),
              ("read_bytes_s", "reads", bytes_per_s),
              ("major_faults_s", "faults", lambda v: _num(v, "{:.1f}", "/s")),
              ("disk_read_bytes_s", "disk", bytes_per_s)]
_PHASE_ORDER = ["data", "h2d", "forward", "backward", "optimizer", "eval", "other", "warmup", "outside"]


def _phase_table(section: SamplerSection, cols) -> FitTable:
    """A sampler's figures per phase. Its cells never wrap or truncate: at a narrow width the
    columns continue in a second table under the first (format.FitTable)."""
    phases = section.phases
    rows = [["[bold]steps[/bold]", str(sum(p.samples for k, p in phases.items() if k not in ("warmup", "outside"))),
             *[fmt(section.mean(key)) for key, _, fmt in cols]]]
    for ph in sorted(phases, key=lambda p: _PHASE_ORDER.index(p) if p in _PHASE_ORDER else 99):
        row = phases[ph]
        rows.append([ph, str(row.samples), *[fmt(row.figure(key)) for key, _, fmt in cols]])
    headers = [("phase", "left"), ("n", "right")] + [(label, "right") for _, label, _ in cols]
    return FitTable(headers, rows, show_edge=False, pad_edge=False)


def _quality(section: SamplerSection) -> str:
    share = section.cost.share_of_one_core
    return (f"samples {section.samples or 0} every {_num(section.interval_s, '{:g}', ' s')}, "
            f"late {section.late_ticks or 0}, errors {section.errors or 0}; "
            f"cost {_num(section.cost.thread_cpu_s, '{:.3f}', ' s')} CPU"
            + (f" ({share * 100:.2f}% of one core)" if share is not None else ""))


def _host_quality(section: HostSection) -> str:
    """The host sampler's merged and dropped samples (CPU rates over too short or impossible intervals)."""
    out = ""
    if section.merged_short:
        out += f", {section.merged_short} short intervals merged into the next"
    if section.dropped:
        out += ", dropped " + ", ".join(f"{n} ({reason.replace('_', ' ')})"
                                        for reason, n in sorted(section.dropped.items()))
    return out


def samplers_panel(measurements: dict | Sections) -> Panel:
    """GPU (NVML) and host (psutil) samples, overall and per phase, with each sampler's quality.
    `measurements`: a profile's sections (Profile.sections), or its measurements dict."""
    sections = measurements if isinstance(measurements, Sections) else Sections.from_measurements(measurements)
    parts: list = []
    nv = sections.nvml
    parts.append(Text("GPU (NVML)", style="bold underline"))
    if not nv.present:
        parts.append(Text(f"  {NM}"))
    elif not nv.available:
        parts.append(Text(f"  {NM}: {nv.reason}"))
    else:
        parts.append(Text(f"  {nv.first.name or 'GPU'}  {_quality(nv)}", style="dim"))
        parts.append(_phase_table(nv, _NVML_COLS))
        thr = nv.throttle_share
        if thr:
            parts.append(Text("  clock-event reasons: " + ", ".join(
                f"{k} {v * 100:.0f}% of samples" for k, v in sorted(thr.items(), key=lambda kv: -kv[1]))))
        if nv.unreadable:
            parts += _notes([f"could not read {k}: {v}" for k, v in nv.unreadable.items()])
    hs = sections.host
    parts.append(Text("Host (psutil)", style="bold underline"))
    if not hs.present:
        parts.append(Text(f"  {NM}"))
    elif not hs.available:
        parts.append(Text(f"  {NM}: {hs.reason}"))
    else:
        parts.append(Text(f"  {_quality(hs)}{_host_quality(hs)}; data disk {hs.disk or NM}", style="dim"))
        parts.append(_phase_table(hs, _HOST_COLS))
        if hs.cpu_count:
            parts.append(Text(f"  this run, others: cores of {hs.cpu_count}; this run = this process + its child "
                              "processes (DataLoader workers); others = machine busy - this run", style="dim"))
        if hs.disk_reason:
            parts += _notes([f"data disk: {hs.disk_reason}"])
        if hs.unreadable:
            parts += _notes([f"could not read {k}: {v}" for k, v in hs.unreadable.items()])
    return Panel(Group(*parts), title="What the machine did", expand=False)


def log_analysis_panel(result: dict) -> Panel:
    """What a nanoGPT log implies: FLOPs, model size, true MFU, the floor, the verdict."""
    return details_panel(log_view(result))
