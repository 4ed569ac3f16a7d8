"""Rules over a log-only analysis (analysis.logs.analyze_log): nothing was run or measured by
gpuprof, so findings come from the log's own numbers and the stated formulas."""

from __future__ import annotations

from gpuprof.analysis.findings import Finding


def log_findings(result: dict) -> list[Finding]:
    """Findings for `gpuprof analyze --log`: the MFU claim and the step-time verdict."""
    out: list[Finding] = []
    rep, true = result.get("reported_mfu_pct"), result.get("true_mfu")
    if result.get("misreport"):
        title = f"the printed MFU {rep:.1f}% is wrong"
        if true is not None:
            title += f": the true MFU is {true * 100:.1f}%"
        if rep is not None and rep > 100:
            title += " (above 100% is impossible)"
        out.append(Finding(
            id="mfu-misreported", title=title, saving_s=None, saving_share=None, kind="correction",
            evidence={"reported_pct": rep, "true_pct": true * 100 if true is not None else None,
                      "peak_tflops": result.get("peak_tflops"), "gpu": result.get("gpu_name")},
            confidence="high",
            fix=(f"flops_promised = {result['peak_tflops']:g}e12 in estimate_mfu (this GPU's "
                 f"{result.get('dtype')} peak), not the A100's 312e12"),
            note=" ".join(r["text"] for r in result["misreport"]),
        ))
    verdict = result.get("verdict") or {}
    ratio, floor, step = result.get("step_over_floor"), result.get("floor_s"), result.get("step_s_median")
    if verdict and ratio:
        ev = {"step_s": step, "floor_s": floor, "times_floor": ratio,
              "implied_params": result.get("implied_params"), "true_mfu": true}
        if verdict["id"] in ("healthy", "suspicious"):
            out.append(Finding(
                id="compute-bound",
                title=(f"compute-bound: {step:.3g} s per step is {ratio:.1f}x the FLOP floor "
                       f"({floor:.3g} s) for a ~{(result.get('implied_params') or 0) / 1e9:.2f}B-parameter model"),
                saving_s=None, saving_share=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict["text"],
            ))
        elif verdict["id"] in ("fair", "slow"):
            out.append(Finding(
                id="step-far-from-floor",
                title=f"the step is {ratio:.1f}x its FLOP floor ({floor:.3g} s): true MFU {true * 100:.1f}%",
                saving_s=None, saving_share=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict["text"],
            ))
        else:
            out.append(Finding(
                id="step-time-impossible",
                title=f"the logged step ({step:.3g} s) is faster than the FLOP floor ({floor:.3g} s)",
                saving_s=None, saving_share=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict["text"],
            ))
    return out
