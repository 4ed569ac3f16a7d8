"""Rules over a log-only analysis (analysis.logs.analyze_log): nothing was run or measured by
gpuprof, so findings come from the log's own numbers and the stated formulas."""

from __future__ import annotations

from gpuprof.analysis.findings import Finding
from gpuprof.analysis.mfu_results import LogAnalysis
from gpuprof.analysis.rules.machine import misreport_finding
from gpuprof.units import pct, seconds, times


def log_findings(result: LogAnalysis) -> list[Finding]:
    """Findings for `gpuprof analyze --log`: the MFU claim and the step-time verdict."""
    out: list[Finding] = []
    rep, true = result.reported_mfu_pct, result.true_mfu
    if result.misreport and rep is not None:
        out += misreport_finding(rep, true, result.peak_tflops, result.dtype, "log", reasons=result.misreport,
                                 gpu=result.gpu_name, flops_per_step=result.flops_per_step,
                                 step_s=result.step_s_median, step_words="median",
                                 evidence={"gpu": result.gpu_name})
    verdict = result.verdict
    ratio, floor, step = result.step_over_floor, result.floor_s, result.step_s_median
    if verdict is not None and ratio:
        ev = {"step_s": step, "floor_s": floor, "times_floor": ratio,
              "implied_params": result.implied_params, "true_mfu": true}
        flops = result.flops_per_step
        because = (f"the log's median step is {seconds(step)}; the FLOP floor"
                   + (f" of its {flops:.3g} FLOPs per step" if flops else "")
                   + f" at 100% of the {result.dtype} peak of {result.gpu_name or 'the GPU'} is "
                   f"{seconds(floor)}: the step is {times(ratio)} the floor"
                   + (f", a true MFU of {pct(true)}" if true is not None else ""))
        if verdict.id in ("healthy", "suspicious"):
            out.append(Finding(
                id="compute-bound",
                title=(f"compute-bound: {seconds(step)} per step is {ratio:.1f}x the FLOP floor "
                       f"({seconds(floor)}) for a ~{(result.implied_params or 0) / 1e9:.2f}B-parameter model"),
                saving_s=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict.text, because=because,
            ))
        elif verdict.id in ("fair", "slow"):
            out.append(Finding(
                id="step-far-from-floor",
                title=f"the step is {ratio:.1f}x its FLOP floor ({seconds(floor)}): true MFU {true * 100:.1f}%",
                saving_s=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict.text, because=because,
            ))
        else:
            out.append(Finding(
                id="step-time-impossible",
                title=f"the logged step ({seconds(step)}) is faster than the FLOP floor ({seconds(floor)})",
                saving_s=None, evidence=ev, confidence="medium", kind="verdict",
                note=verdict.text, because=because,
            ))
    return out

