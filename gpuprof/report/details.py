"""The `--details` MFU panel and `gpuprof analyze-log`'s panel decided once: each row's label,
figure and note, the printed-MFU lines, the verdict and the warnings, from the analysis's MFU
result (analysis/mfu.py) or log analysis (analysis/logs.py). gpuprof.render.mfu lays them out.
A missing figure reads "not measured" (units.NM)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.units import NM, flops_rate, pct, seconds

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


def _misreport(items) -> tuple[Line, ...]:
    return tuple(Line(f"  - {m['text']}", BAD if m.get("cause") == "impossible" else PLAIN) for m in items or [])


def mfu_view(mfu: dict) -> DetailsView:
    """The MFU section: FLOPs, peak, both MFUs, the floor, a misreport explained."""
    fm = mfu.get("flops_method")
    after = ""
    if mfu.get("flops_analytic_per_step") is not None or mfu.get("flops_counted_per_step") is not None:
        after = (f"  (analytic {_flops(mfu.get('flops_analytic_per_step'))}, counted "
                 f"{_flops(mfu.get('flops_counted_per_step'))}, counted/analytic {pct(mfu.get('flops_agreement'))})")
    peak = mfu.get("peak_tflops")
    timeline = mfu.get("timeline")
    rows = [Row("Model FLOPs / step", _flops(mfu.get("flops_per_step")), f"MFU uses {fm}" if fm else "", after),
            # the step printed above the findings, with its statistic: here only that figure again
            Row("Step time", seconds(mfu.get("step_s")), f"{timeline} timeline" if timeline else ""),
            Row("Achieved", flops_rate(mfu.get("achieved_tflops"))),
            Row(f"Peak ({mfu.get('dtype') or '?'}, {mfu.get('gpu_name') or mfu.get('device_name') or 'device'})",
                flops_rate(peak) if peak else "no datasheet peak", str(mfu.get("peak_source") or "") if peak else ""),
            Row("MFU vs datasheet", pct(mfu.get("mfu")) if peak else "not applicable")]
    ceil = mfu.get("ceiling_tflops")
    if ceil is None:
        rows.append(Row("Measured ceiling", flops_rate(ceil)))
    else:
        how = ", ".join(str(x) for x in (mfu.get("ceiling_method"),
                                         mfu.get("ceiling_dtype") and f"{mfu['ceiling_dtype']} matmul") if x)
        share = mfu.get("ceiling_share_of_peak")
        rows.append(Row("Measured ceiling", flops_rate(ceil), how,
                        f" = {pct(share)} of datasheet" if share is not None else ""))
    rows.append(Row("MFU vs ceiling", pct(mfu.get("mfu_vs_ceiling"))))
    floor = mfu.get("floor_s")
    if floor is not None:
        rows.append(floor_row(floor, mfu.get("expected_step_s"), mfu.get("step_over_floor"),
                              f"; measured {seconds(mfu.get('step_s'))}"))
    else:
        rows.append(Row("Step-time floor", NM if peak else "not applicable (no datasheet peak)"))
    if mfu.get("floor_s_ceiling") is not None:
        rows.append(Row("Floor at ceiling", seconds(mfu["floor_s_ceiling"])))
    lines: tuple[Line, ...] = ()
    if mfu.get("reported_mfu_pct") is not None:
        lines = (Line(f"Printed MFU {mfu['reported_mfu_pct']:.1f}% ({mfu.get('reported_source')}):", heading=True),
                 *_misreport(mfu.get("misreport")))
    return DetailsView("Model FLOPs utilization", tuple(rows), lines, warnings=tuple(mfu.get("warnings") or ()))


_VERDICT_TONE = {"impossible": BAD, "suspicious": WARN, "healthy": GOOD, "slow": BAD}


def log_view(r: dict) -> DetailsView:
    """What a nanoGPT log implies: FLOPs, model size, true MFU, the floor, the verdict."""
    rep, imp, peak = r.get("reported_mfu_pct"), r.get("implied_params"), r.get("peak_tflops")
    fpt = r.get("flops_per_token")
    rows = [Row("Log", f"{r.get('iter_lines')} iteration lines (iters {r.get('first_iter')}-{r.get('last_iter')}), "
                       f"{r.get('eval_lines')} eval lines in {r.get('path')}"),
            Row("Step time (median)", seconds(r.get("step_s_median")),
                f"(p10 {seconds(r.get('step_s_p10'))}, p90 {seconds(r.get('step_s_p90'))})"),
            Row("Printed MFU (median)", NM if rep is None else f"{rep:.1f}%"),
            Row("Tokens / step / GPU", NM if r.get("tokens_per_step") is None else f"{r['tokens_per_step']:,}"),
            Row("FLOPs / step", _flops(r.get("flops_per_step")), str(r.get("flops_source") or "")),
            Row("FLOPs / token", NM if not fpt else f"{fpt / 1e9:.2f} G"),
            Row("Implied model size", NM if imp is None else f"{imp / 1e6:,.0f}M parameters",
                f"({r.get('implied_params_method')})" if imp is not None else ""),
            Row(f"Peak ({r.get('dtype')}, {r.get('gpu_name') or 'no GPU given'})", flops_rate(peak) if peak else NM,
                str(r.get("peak_source") or "") if peak else ""),
            Row("True MFU", pct(r.get("true_mfu")))]
    floor = r.get("floor_s")
    rows.append(floor_row(floor, r.get("expected_step_s"), r.get("step_over_floor")) if floor is not None
                else Row("Step-time floor", NM))
    lines = []
    v = r.get("verdict")
    if v:
        lines.append(Line(f"Verdict: {v['id']}: {v['text']}", _VERDICT_TONE.get(v["id"], PLAIN)))
    lines += _misreport(r.get("misreport"))
    size = tuple((row["model"], f"{row['params'] / 1e6:,.0f}M", seconds(row.get("floor_s")),
                  pct(row.get("true_mfu_at_step")), pct(row.get("nanogpt_mfu_at_step")))
                 for row in r.get("size_table") or [])
    return DetailsView("nanoGPT log analysis", tuple(rows), tuple(lines),
                       table_caption="If the model were…" if size else "",
                       table_columns=("model", "params", "floor", "true MFU at logged step", "nanoGPT would print"),
                       table_rows=size, warnings=tuple(r.get("warnings") or ()))
