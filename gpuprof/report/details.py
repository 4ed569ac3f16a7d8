"""The `--details` panels and `gpuprof analyze --log`'s panel decided once: for the MFU panel and
the log's, each row's label, figure and note, the printed-MFU lines, the verdict and the warnings,
from the analysis's MfuResult (analysis/mfu.py) or LogAnalysis (analysis/logs.py); for the
samplers' panel, each sampler's status, its figures per phase and its notes, from the profile's
typed sections. gpuprof.render.mfu lays them out. A missing figure reads "not measured"
(units.NM)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.analysis.mfu_results import IMPOSSIBLE, LogAnalysis, MfuResult, MisreportCause
from gpuprof.sections import HostSection, SamplerSection, Sections
from gpuprof.units import NA, NM, UNKNOWN, bytes_per_s, flops_rate, gib, pct, seconds

# A line's tone: how much it matters to the reader. The renderer picks the colour.
BAD, WARN, GOOD, PLAIN = "bad", "warn", "good", ""


@dataclass(frozen=True)
class Row:
    label: str
    value: str
    note: str = ""  # said quietly after the value: where the figure comes from
    after: str = ""  # more of the figure, after the note


@dataclass(frozen=True)
class Line:
    text: str
    tone: str = PLAIN
    heading: bool = False


@dataclass(frozen=True)
class DetailsView:
    title: str
    rows: tuple[Row, ...]
    lines: tuple[Line, ...] = ()
    table_caption: str = ""  # a small table under the lines (the log's "if the model were…")
    table_columns: tuple[str, ...] = ()
    table_rows: tuple[tuple[str, ...], ...] = ()
    warnings: tuple[str, ...] = ()


def _flops(x) -> str:
    return NM if x is None else f"{x:.3g} FLOP"


def floor_row(floor, expected: dict | None, over: float | None, measured: str = "") -> Row:
    """The step-time floor (FLOPs ÷ peak) with the step expected at the usual MFU band, and how
    far the measured (or logged) step is above it: one wording for diagnose and analyze-log."""
    text = (f"{seconds(floor)} at 100% of peak; expected "
            + ", ".join(f"{seconds(v)} at {k}" for k, v in (expected or {}).items()) + measured)
    if over:
        text += f"{'' if measured else ';'} {'= ' if measured else 'logged '}{over:.2f}× the floor"
    return Row("Step-time floor", text)


def _misreport(items: tuple[MisreportCause, ...]) -> tuple[Line, ...]:
    return tuple(Line(f"  - {m.text}", BAD if m.cause == IMPOSSIBLE else PLAIN) for m in items)


def mfu_view(mfu: MfuResult) -> DetailsView:
    """The MFU section: FLOPs, peak, both MFUs, the floor, a misreport explained."""
    fm = mfu.flops_method
    after = ""
    if mfu.flops_analytic_per_step is not None or mfu.flops_counted_per_step is not None:
        after = (f"  (analytic {_flops(mfu.flops_analytic_per_step)}, counted "
                 f"{_flops(mfu.flops_counted_per_step)}, counted/analytic {pct(mfu.flops_agreement)})")
    peak = mfu.peak_tflops
    timeline = mfu.timeline
    rows = [Row("Model FLOPs / step", _flops(mfu.flops_per_step), f"MFU uses {fm}" if fm else "", after),
            # the step printed above the findings, with its statistic: here only that figure again
            Row("Step time", seconds(mfu.step_s), f"{timeline} timeline" if timeline else ""),
            Row("Achieved", flops_rate(mfu.achieved_tflops)),
            Row(f"Peak ({mfu.dtype or UNKNOWN}, {mfu.device_label or 'device'})",
                flops_rate(peak) if peak else "no datasheet peak", str(mfu.peak_source or "") if peak else ""),
            Row("MFU vs datasheet", pct(mfu.mfu) if peak else NA)]
    ceil = mfu.ceiling_tflops
    if ceil is None:
        rows.append(Row("Measured ceiling", flops_rate(ceil)))
    else:
        how = ", ".join(str(x) for x in (mfu.ceiling_method,
                                         mfu.ceiling_dtype and f"{mfu.ceiling_dtype} matmul") if x)
        share = mfu.ceiling_share_of_peak
        rows.append(Row("Measured ceiling", flops_rate(ceil), how,
                        f" = {pct(share)} of datasheet" if share is not None else ""))
    rows.append(Row("MFU vs ceiling", pct(mfu.mfu_vs_ceiling)))
    floor = mfu.floor_s
    if floor is not None:
        rows.append(floor_row(floor, mfu.expected_step_s, mfu.step_over_floor,
                              f"; measured {seconds(mfu.step_s)}"))
    else:
        rows.append(Row("Step-time floor", NM if peak else f"{NA} (no datasheet peak)"))
    if mfu.floor_s_ceiling is not None:
        rows.append(Row("Floor at ceiling", seconds(mfu.floor_s_ceiling)))
    lines: tuple[Line, ...] = ()
    if mfu.reported_mfu_pct is not None:
        lines = (Line(f"Printed MFU {mfu.reported_mfu_pct:.1f}% ({mfu.reported_source}):", heading=True),
                 *_misreport(mfu.misreport))
    return DetailsView("Model FLOPs utilization", tuple(rows), lines, warnings=mfu.warnings)


_VERDICT_TONE = {"impossible": BAD, "suspicious": WARN, "healthy": GOOD, "slow": BAD}


def log_view(r: LogAnalysis) -> DetailsView:
    """What a nanoGPT log implies: FLOPs, model size, true MFU, the floor, the verdict."""
    rep, imp, peak = r.reported_mfu_pct, r.implied_params, r.peak_tflops
    fpt = r.flops_per_token
    rows = [Row("Log", f"{r.iter_lines} iteration lines (iters {r.first_iter}-{r.last_iter}), "
                       f"{r.eval_lines} eval lines in {r.path}"),
            Row("Step time (median)", seconds(r.step_s_median),
                f"(p10 {seconds(r.step_s_p10)}, p90 {seconds(r.step_s_p90)})"),
            Row("Printed MFU (median)", NM if rep is None else f"{rep:.1f}%"),
            Row("Tokens / step / GPU", NM if r.tokens_per_step is None else f"{r.tokens_per_step:,}"),
            Row("FLOPs / step", _flops(r.flops_per_step), str(r.flops_source or "")),
            Row("FLOPs / token", NM if not fpt else f"{fpt / 1e9:.2f} G"),
            Row("Implied model size", NM if imp is None else f"{imp / 1e6:,.0f}M parameters",
                f"({r.implied_params_method})" if imp is not None else ""),
            Row(f"Peak ({r.dtype}, {r.gpu_name or 'no GPU given'})", flops_rate(peak) if peak else NM,
                str(r.peak_source or "") if peak else ""),
            Row("True MFU", pct(r.true_mfu))]
    floor = r.floor_s
    rows.append(floor_row(floor, r.expected_step_s, r.step_over_floor) if floor is not None
                else Row("Step-time floor", NM))
    lines = []
    v = r.verdict
    if v is not None:
        lines.append(Line(f"Verdict: {v.id}: {v.text}", _VERDICT_TONE.get(v.id, PLAIN)))
    lines += _misreport(r.misreport)
    size = tuple((row.model, f"{row.params / 1e6:,.0f}M", seconds(row.floor_s),
                  pct(row.true_mfu_at_step), pct(row.nanogpt_mfu_at_step))
                 for row in r.size_table)
    return DetailsView("nanoGPT log analysis", tuple(rows), tuple(lines),
                       table_caption="If the model were…" if size else "",
                       table_columns=("model", "params", "floor", "true MFU at logged step", "nanoGPT would print"),
                       table_rows=size, warnings=r.warnings)


# ------------------------------------------------------------------------------------ samplers
QUIET = "quiet"  # a tone for a line said quietly: how a figure was sampled


@dataclass(frozen=True)
class SamplerBlock:
    """One sampler's part of the samplers panel: its heading, a status line (its quality, or why
    nothing was sampled), its figures per phase (the first row the measured steps together), lines
    under the table, and warnings."""

    heading: str
    status: Line
    columns: tuple[str, ...] = ()  # "phase", "n", then one per figure
    rows: tuple[tuple[str, ...], ...] = ()
    lines: tuple[Line, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SamplersView:
    title: str
    blocks: tuple[SamplerBlock, ...]


def _num(x, fmt: str = "{:.3g}", unit: str = "") -> str:
    return NM if x is None else fmt.format(x) + unit


# (figure, column label, how it reads): the NVML and host samplers' figures per phase.
NVML_COLS = (("gpu_util_pct", "GPU util", lambda v: _num(v, "{:.0f}", "%")),
             ("sm_clock_share", "SM clock/max", pct),
             ("power_share", "power/limit", pct),
             ("mem_used_bytes", "mem used", gib),
             ("temp_c", "temp", lambda v: _num(v, "{:.0f}", " °C")),
             ("pcie_rx_bytes_s", "PCIe rx", bytes_per_s),
             ("pcie_tx_bytes_s", "PCIe tx", bytes_per_s))
HOST_COLS = (("cpu_pct", "CPU", lambda v: _num(v, "{:.0f}", "%")),
             ("cpu_pct_max_core", "max core", lambda v: _num(v, "{:.0f}", "%")),
             ("own_cpu_cores", "this run", lambda v: _num(v, "{:.2f}")),  # cores
             ("others_cpu_cores", "others", lambda v: _num(v, "{:.2f}")),  # cores
             ("rss_bytes", "RSS", gib),
             ("read_bytes_s", "reads", bytes_per_s),
             ("major_faults_s", "faults", lambda v: _num(v, "{:.1f}", "/s")),
             ("disk_read_bytes_s", "disk", bytes_per_s))
_PHASE_ORDER = ["data", "h2d", "forward", "backward", "optimizer", "eval", "other", "warmup", "outside"]


def _phase_rows(section: SamplerSection, cols) -> tuple[tuple[str, ...], ...]:
    """A sampler's figures: the measured steps together (warm-up and outside left out), then each phase."""
    phases = section.phases
    rows = [("steps", str(sum(p.samples for k, p in phases.items() if k not in ("warmup", "outside"))),
             *[fmt(section.mean(key)) for key, _, fmt in cols])]
    for ph in sorted(phases, key=lambda p: _PHASE_ORDER.index(p) if p in _PHASE_ORDER else 99):
        row = phases[ph]
        rows.append((ph, str(row.samples), *[fmt(row.figure(key)) for key, _, fmt in cols]))
    return tuple(rows)


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


def _unsampled(heading: str, section: SamplerSection) -> SamplerBlock | None:
    if not section.present:
        return SamplerBlock(heading, Line(f"  {NM}"))
    if not section.available:
        return SamplerBlock(heading, Line(f"  {NM}: {section.reason}"))
    return None


def _columns(cols) -> tuple[str, ...]:
    return ("phase", "n", *(label for _, label, _ in cols))


def samplers_view(sections: Sections) -> SamplersView:
    """GPU (NVML) and host (psutil) samples, overall and per phase, with each sampler's quality."""
    nv, hs = sections.nvml, sections.host
    gpu = _unsampled("GPU (NVML)", nv)
    if gpu is None:
        thr = nv.throttle_share
        lines = (Line("  clock-event reasons: " + ", ".join(
            f"{k} {v * 100:.0f}% of samples" for k, v in sorted(thr.items(), key=lambda kv: -kv[1]))),) if thr else ()
        gpu = SamplerBlock("GPU (NVML)", Line(f"  {nv.first.name or 'GPU'}  {_quality(nv)}", QUIET),
                           _columns(NVML_COLS), _phase_rows(nv, NVML_COLS), lines,
                           tuple(f"could not read {k}: {v}" for k, v in nv.unreadable.items()))
    host = _unsampled("Host (psutil)", hs)
    if host is None:
        lines = (Line(f"  this run, others: cores of {hs.cpu_count}; this run = this process + its child "
                      "processes (DataLoader workers); others = machine busy - this run", QUIET),) if hs.cpu_count else ()
        warnings = ((f"data disk: {hs.disk_reason}",) if hs.disk_reason else ()) + tuple(
            f"could not read {k}: {v}" for k, v in hs.unreadable.items())
        host = SamplerBlock("Host (psutil)", Line(f"  {_quality(hs)}{_host_quality(hs)}; data disk {hs.disk or NM}",
                                                  QUIET),
                            _columns(HOST_COLS), _phase_rows(hs, HOST_COLS), lines, warnings)
    return SamplersView("What the machine did", (gpu, host))
