"""Rich renderables for MFU, the samplers and a log analysis. Builds, never prints.

Every figure comes from the dict passed in (the samplers: the typed sections, gpuprof.sections);
a missing one reads "not measured".
"""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuprof.render.format import FitTable
from gpuprof.sections import HostSection, SamplerSection, Sections
from gpuprof.units import NM, bytes_per_s, flops_rate, gib, pct, seconds


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


# ----------------------------------------------------------------------------------------- MFU
def mfu_panel(mfu: dict) -> Panel:
    """The MFU section of a report: FLOPs, peak, both MFUs, the floor, a misreport explained."""
    t = _kv_table()
    fm = mfu.get("flops_method")
    extra = ""
    if mfu.get("flops_analytic_per_step") is not None or mfu.get("flops_counted_per_step") is not None:
        extra = (f"  (analytic {_flops(mfu.get('flops_analytic_per_step'))}, counted "
                 f"{_flops(mfu.get('flops_counted_per_step'))}, counted/analytic "
                 f"{pct(mfu.get('flops_agreement'))})")
    t.add_row("Model FLOPs / step", f"{_flops(mfu.get('flops_per_step'))}"
              + (f" [dim]MFU uses {fm}[/dim]" if fm else "") + extra)
    timeline = mfu.get("timeline")
    # The step printed above the findings, with its statistic: here it is only that figure again.
    t.add_row("Step time", seconds(mfu.get("step_s")) + (f" [dim]{timeline} timeline[/dim]" if timeline else ""))
    t.add_row("Achieved", flops_rate(mfu.get("achieved_tflops")))
    dtype = mfu.get("dtype") or "?"
    peak = mfu.get("peak_tflops")
    gpu = mfu.get("gpu_name") or mfu.get("device_name") or "device"
    t.add_row(f"Peak ({dtype}, {gpu})",
              (flops_rate(peak) + f" [dim]{mfu.get('peak_source')}[/dim]") if peak else "no datasheet peak")
    t.add_row("MFU vs datasheet", pct(mfu.get("mfu")) if peak else "not applicable")
    ceil = mfu.get("ceiling_tflops")
    ceil_txt = flops_rate(ceil)
    if ceil is not None:
        how = ", ".join(str(x) for x in (mfu.get("ceiling_method"), mfu.get("ceiling_dtype") and
                                         f"{mfu['ceiling_dtype']} matmul") if x)
        ceil_txt += f" [dim]{how}[/dim]" if how else ""
        if mfu.get("ceiling_share_of_peak") is not None:
            ceil_txt += f" = {pct(mfu['ceiling_share_of_peak'])} of datasheet"
    t.add_row("Measured ceiling", ceil_txt)
    t.add_row("MFU vs ceiling", pct(mfu.get("mfu_vs_ceiling")))
    floor = mfu.get("floor_s")
    if floor is not None:
        exp = mfu.get("expected_step_s") or {}
        t.add_row("Step-time floor", f"{seconds(floor)} at 100% of peak; expected "
                  + ", ".join(f"{seconds(v)} at {k}" for k, v in exp.items())
                  + f"; measured {seconds(mfu.get('step_s'))}"
                  + (f" = {mfu['step_over_floor']:.2f}× the floor" if mfu.get("step_over_floor") else ""))
    else:
        t.add_row("Step-time floor", NM if peak else "not applicable (no datasheet peak)")
    if mfu.get("floor_s_ceiling") is not None:
        t.add_row("Floor at ceiling", seconds(mfu["floor_s_ceiling"]))
    parts: list = [t]
    if mfu.get("reported_mfu_pct") is not None:
        parts.append(Text(f"Printed MFU {mfu['reported_mfu_pct']:.1f}% ({mfu.get('reported_source')}):",
                          style="bold"))
        for m in mfu.get("misreport") or []:
            style = "red" if m.get("cause") == "impossible" else ""
            parts.append(Text(f"  - {m['text']}", style=style))
    parts += _notes(mfu.get("warnings"))
    return Panel(Group(*parts), title="Model FLOPs utilization", expand=False)


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


# ---------------------------------------------------------------------------------------- logs
def log_analysis_panel(result: dict) -> Panel:
    """What a nanoGPT log implies: FLOPs, model size, true MFU, the floor, the verdict."""
    r = result
    t = _kv_table()
    t.add_row("Log", f"{r.get('iter_lines')} iteration lines (iters {r.get('first_iter')}-{r.get('last_iter')}), "
              f"{r.get('eval_lines')} eval lines in {r.get('path')}")
    t.add_row("Step time (median)", f"{seconds(r.get('step_s_median'))} "
              f"[dim](p10 {seconds(r.get('step_s_p10'))}, p90 {seconds(r.get('step_s_p90'))})[/dim]")
    rep = r.get("reported_mfu_pct")
    t.add_row("Printed MFU (median)", NM if rep is None else f"{rep:.1f}%")
    t.add_row("Tokens / step / GPU", NM if r.get("tokens_per_step") is None else f"{r['tokens_per_step']:,}")
    t.add_row("FLOPs / step", _flops(r.get("flops_per_step"))
              + (f" [dim]{r['flops_source']}[/dim]" if r.get("flops_source") else ""))
    t.add_row("FLOPs / token", _num(r.get("flops_per_token") and r["flops_per_token"] / 1e9, "{:.2f}", " G"))
    imp = r.get("implied_params")
    t.add_row("Implied model size", NM if imp is None else
              f"{imp / 1e6:,.0f}M parameters [dim]({r.get('implied_params_method')})[/dim]")
    peak = r.get("peak_tflops")
    t.add_row(f"Peak ({r.get('dtype')}, {r.get('gpu_name') or 'no GPU given'})",
              (flops_rate(peak) + f" [dim]{r.get('peak_source')}[/dim]") if peak else NM)
    t.add_row("True MFU", pct(r.get("true_mfu")))
    floor = r.get("floor_s")
    if floor is not None:
        exp = r.get("expected_step_s") or {}
        t.add_row("Step-time floor", f"{seconds(floor)} at 100% of peak; expected "
                  + ", ".join(f"{seconds(v)} at {k}" for k, v in exp.items())
                  + (f"; logged {r['step_over_floor']:.2f}× the floor" if r.get("step_over_floor") else ""))
    else:
        t.add_row("Step-time floor", NM)
    parts: list = [t]
    v = r.get("verdict")
    if v:
        style = {"impossible": "red", "suspicious": "yellow", "healthy": "green", "slow": "red"}.get(v["id"], "")
        parts.append(Text(f"Verdict: {v['id']}: {v['text']}", style=style))
    for m in r.get("misreport") or []:
        parts.append(Text(f"  - {m['text']}", style="red" if m.get("cause") == "impossible" else ""))
    if r.get("size_table"):
        rows = [[row["model"], f"{row['params'] / 1e6:,.0f}M", seconds(row.get("floor_s")),
                 pct(row.get("true_mfu_at_step")), pct(row.get("nanogpt_mfu_at_step"))] for row in r["size_table"]]
        parts.append(Text("If the model were…", style="italic"))
        parts.append(FitTable([(col, "right") for col in ("model", "params", "floor", "true MFU at logged step",
                                                          "nanoGPT would print")], rows, show_edge=False))
    parts += _notes(r.get("warnings"))
    return Panel(Group(*parts), title="nanoGPT log analysis", expand=False)
