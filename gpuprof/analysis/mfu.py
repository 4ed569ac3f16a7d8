"""True MFU: model FLOPs per step over (the typical step's time × the peak of the dtype in use).

Two denominators: the datasheet's dense peak for the GPU and dtype (hardware.py), and the
measured matmul ceiling of this device (measure/probe.py). Also the step-time floor (FLOPs ÷
peak: the fastest this step can ever run here), the step time expected across the band
hardware.EXPECTED_MFU, and, when the script printed an MFU, why it differs from the true one.
Pure: reads a Profile, returns an MfuResult (analysis/mfu_results.py), prints nothing.
"""

from __future__ import annotations

from gpuprof.analysis.mfu_results import AGREES, CANNOT_CHECK, IMPOSSIBLE, MfuResult, MisreportCause
from gpuprof.analysis.precision import run_compute_dtype
from gpuprof.hardware import EXPECTED_MFU, find_gpu, peak_for
from gpuprof.dims import gpt_flops_per_token, missing_gpt_dims

NANOGPT_A100_TFLOPS = 312.0  # nanoGPT's estimate_mfu `flops_promised`, whatever the GPU
# Scripts whose printed MFU divides by a per-GPU peak table of their own (nanochat's common.py
# get_peak_flops, torchtitan's tools/utils.py get_peak_flops, llm.c's mfu.h): not nanoGPT's A100.
OWN_PEAK_FORMATS = frozenset({"nanochat", "torchtitan", "llm.c"})
MATCH_TOLERANCE = 0.15  # a cause explains a misreport when it predicts the ratio within ±15%


def flops_per_step(profile) -> tuple[float | None, str | None, dict]:
    """(FLOPs per optimizer step, method, detail) from measurements['flops'], else the config."""
    fl = profile.sections.flops
    detail = {"analytic_per_step": fl.analytic_per_step, "counted_per_step": fl.counted_per_step,
              "agreement": fl.agreement}
    if fl.used == "analytic" and fl.analytic_per_step:
        return float(fl.analytic_per_step), "analytic", detail
    if fl.used == "counted" and fl.counted_per_step:
        return float(fl.counted_per_step), "counted", detail
    cfg = profile.run.get("config", {}) if profile.run else {}
    dims = cfg.get("model_dims")
    tokens = cfg.get("tokens_per_step") or (profile.stats.tokens_per_step if profile.stats else None)
    missing = missing_gpt_dims(dims, cfg.get("param_count")) if dims else None
    if dims and tokens and not missing:
        per_tok = gpt_flops_per_token(dims, cfg.get("param_count"))
        detail["analytic_per_step"] = per_tok * tokens
        return per_tok * tokens, "analytic", detail
    if missing:
        detail["why"] = (f"the model is not GPT-shaped as far as gpuprof can see (no {', '.join(missing)}), "
                         f"so the GPT formula does not apply, and no FLOP count was made")
    return None, None, detail


def resolve_peak(device: str | None, device_name: str | None, dtype: str, tf32: bool, *,
                 gpu: str | None = None, peak_tflops: float | None = None) -> dict:
    """The peak to divide by: --peak-tflops, else --gpu, else the reported device name."""
    dev = str(device or "")
    is_cpu = gpu is None and (dev.startswith(("cpu", "mps")) or (
        not dev and str(device_name or "").upper().startswith("CPU")))
    used_dtype, _ = peak_for(None, dtype, tf32 and not is_cpu)
    out = {"gpu_key": None, "gpu_name": None, "dtype": used_dtype, "peak_tflops": None,
           "peak_source": None, "warnings": []}
    if peak_tflops is not None:
        out.update(peak_tflops=float(peak_tflops), peak_source="--peak-tflops")
        spec = find_gpu(gpu or device_name)
        if spec is not None:
            out.update(gpu_key=spec.key, gpu_name=spec.name)
        return out
    if is_cpu:
        out["warnings"].append("CPU run: no datasheet peak; MFU is against the measured matmul ceiling only")
        return out
    spec = find_gpu(gpu or device_name)
    if spec is None:
        what = f"--gpu {gpu!r}" if gpu else f"GPU {device_name!r}"
        out["warnings"].append(
            f"{what} is not in the GPU table: no datasheet peak (gpuprof never borrows another GPU's); "
            "MFU is against the measured ceiling only. Pass --gpu NAME or --peak-tflops X to set it")
        return out
    used_dtype, peak = peak_for(spec, dtype, tf32)
    out.update(gpu_key=spec.key, gpu_name=spec.name, dtype=used_dtype, peak_tflops=peak,
               peak_source=f"datasheet ({spec.source})", bandwidth_tb_s=spec.hbm_tb_s)
    if gpu and device_name and find_gpu(device_name) not in (None, spec):
        out["warnings"].append(f"--gpu {gpu} overrides the reported {device_name!r}")
    if peak is None:
        out["warnings"].append(f"{spec.name} has no {used_dtype} tensor-core peak in its datasheet")
    return out


def compute_mfu(profile, *, gpu: str | None = None, peak_tflops: float | None = None,
                reported_mfu_pct: float | None = None) -> MfuResult:
    """MFU vs the datasheet peak and vs the measured ceiling, the step-time floor, and the
    explanation of a misreported MFU. Fractions (0.31), not percentages, except reported_mfu_pct."""
    env = profile.environment or {}
    cfg = (profile.run or {}).get("config", {}) or {}
    stats = profile.stats
    sections = profile.sections
    dtype, tf32 = run_compute_dtype(profile)  # what the run measured, else what its config says
    peak = resolve_peak(env.get("device"), env.get("device_name"), dtype, tf32, gpu=gpu, peak_tflops=peak_tflops)
    warnings = list(peak.pop("warnings"))
    flops, method, fdetail = flops_per_step(profile)
    step_s = (stats.step_s if stats else None) or None
    if flops is None:
        warnings.append(f"FLOPs per step unknown ({fdetail.get('why') or 'no model dimensions and no FLOP count'})"
                        f": MFU not computed")
    if not step_s:
        warnings.append("no measured steps: MFU not computed")

    achieved = flops / step_s / 1e12 if flops and step_s else None
    p = peak["peak_tflops"]
    probe = sections.probe
    ceiling = probe.tflops
    ceiling_method = probe.method
    # The ceiling is the best this device showed in this dtype: the square product, or the model's
    # own matmul shapes when they ran faster (a square product can take a slower path).
    shaped = probe.precisions.rate(peak["dtype"])
    if shaped and (ceiling is None or shaped > ceiling) and probe.dtype in (None, peak["dtype"]):
        ceiling, ceiling_method = shaped, "the model's own matmul shapes (measure/precisions.py)"
    if probe.error:
        warnings.append(f"matmul probe failed: {probe.error}")
    if ceiling and probe.dtype and probe.dtype != peak["dtype"]:
        # A ceiling in another dtype is not this step's ceiling (an fp32 probe beside a TF32
        # step would be 7x low on an H200): leave it out rather than divide by it.
        warnings.append(f"the matmul ceiling was measured in {probe.dtype}, the step runs in "
                        f"{peak['dtype']}: MFU vs ceiling not measured")
        ceiling = None
    mfu = achieved / p if achieved and p else None
    if ceiling is None and not probe.present:
        warnings.append("no matmul ceiling measured")
    if mfu is not None and mfu > 1.0:
        warnings.append("measured MFU above 100%: the FLOP count or the peak is wrong")

    script = sections.script.reported
    rep, rep_src = reported_mfu_pct, "--reported-mfu"
    own_peak = False
    if rep is None and script.mfu_pct_median is not None:
        rep, rep_src = script.mfu_pct_median, "script output"
        own_peak = script.format in OWN_PEAK_FORMATS
    reported_step_s = script.step_ms_median / 1e3 if script.step_ms_median else None
    name = peak["gpu_name"] or env.get("device_name")
    return MfuResult(
        device=env.get("device"), device_name=env.get("device_name"),
        **peak,
        flops_per_step=flops, flops_method=method,
        flops_analytic_per_step=fdetail.get("analytic_per_step"),
        flops_counted_per_step=fdetail.get("counted_per_step"),
        flops_agreement=fdetail.get("agreement"),
        tokens_per_step=cfg.get("tokens_per_step") or (stats.tokens_per_step if stats else None),
        step_s=step_s, timeline=stats.timeline if stats else None,
        achieved_tflops=achieved, mfu=mfu,
        ceiling_tflops=ceiling, ceiling_method=ceiling_method, ceiling_dtype=probe.dtype,
        ceiling_share_of_peak=ceiling / p if ceiling and p else None,
        mfu_vs_ceiling=achieved / ceiling if achieved and ceiling else None,
        floor_s=flops / (p * 1e12) if flops and p else None,
        floor_s_ceiling=flops / (ceiling * 1e12) if flops and ceiling else None,
        expected_step_s={f"{m:.0%}": flops / (p * 1e12 * m) for m in EXPECTED_MFU} if flops and p else None,
        step_over_floor=(step_s / (flops / (p * 1e12))) if flops and p and step_s else None,
        warnings=tuple(warnings),
        reported_mfu_pct=rep, reported_source=rep_src if rep is not None else None,
        reported_step_s=reported_step_s,
        misreport=explain_misreport(rep, true_mfu=mfu, peak_tflops=p, dtype=peak["dtype"], device=name,
                                    reported_step_s=reported_step_s, step_s=step_s,
                                    own_peak=own_peak) if rep is not None else (),
        reported_impossible=bool(rep is not None and rep > 100.0),
    )


def explain_misreport(reported_pct: float, *, true_mfu: float | None, peak_tflops: float | None,
                      dtype: str | None, device: str | None, reported_step_s: float | None = None,
                      step_s: float | None = None, own_peak: bool = False) -> tuple[MisreportCause, ...]:
    """Why a printed MFU (reported_pct, in %) differs from the true one (true_mfu, a fraction,
    against peak_tflops in `dtype` on `device`), for a measured run and a log alike.

    Causes: nanoGPT's A100 constant (true = reported × 312/peak), timing without
    synchronization (the script's step time, reported_step_s, is shorter than the GPU's step_s),
    a sparse peak (reported = true/2), and anything above 100% flagged as impossible with the
    cause that fits. own_peak: the script divides by a peak table of its own (OWN_PEAK_FORMATS), so
    nanoGPT's A100 constant is no cause."""
    out: list[MisreportCause] = []
    true, peak = true_mfu, peak_tflops
    name = device or "this GPU"
    if true is None or not peak:
        out.append(MisreportCause(CANNOT_CHECK,
                                  "no true MFU to compare with (no datasheet peak or no FLOP count); "
                                  f"pass --gpu or --peak-tflops. Printed: {reported_pct:.1f}%",
                                  {"reported_pct": reported_pct}))
        if reported_pct > 100:
            out.append(_impossible(reported_pct, None))
        return tuple(out)
    true_pct = true * 100
    ratio = reported_pct / true_pct if true_pct else None
    ev = {"reported_pct": reported_pct, "true_pct": true_pct, "ratio": ratio, "peak_tflops": peak}
    candidates = []
    a100 = peak / NANOGPT_A100_TFLOPS
    rescaled = reported_pct * NANOGPT_A100_TFLOPS / peak
    if rescaled <= 100:
        a100_text = (f"nanoGPT divides by the A100's {NANOGPT_A100_TFLOPS:g} TFLOP/s on every GPU; the "
                     f"{dtype} peak of {name} is {peak:g} TFLOP/s, so the printed figure means "
                     f"{reported_pct:.1f}% × {NANOGPT_A100_TFLOPS:g}/{peak:g} = {rescaled:.1f}%")
    else:  # never state an impossible figure as "the true MFU"
        a100_text = (f"nanoGPT divides by the A100's {NANOGPT_A100_TFLOPS:g} TFLOP/s on every GPU; rescaled to "
                     f"the {dtype} peak of {name} ({peak:g} TFLOP/s) the printed figure would still be "
                     f"impossible ({rescaled / 100:.3g}x the peak): its FLOPs or step time are wrong too")
    if not own_peak:
        candidates.append(("a100_constant", a100, a100_text))
    rs, ms = reported_step_s, step_s
    if rs and ms and ms > rs * (1 + MATCH_TOLERANCE):
        unsync = ms / rs
        candidates.append(("unsynchronized_timing", unsync,
                           f"the script timed {rs * 1e3:.1f} ms per step but the GPU timeline says "
                           f"{ms * 1e3:.1f} ms: its timer does not wait for the GPU (no synchronize), "
                           f"which inflates its MFU {unsync:.2f}×"))
        if not own_peak:
            candidates.append(("a100_constant+unsynchronized_timing", a100 * unsync,
                               "both: the A100 constant and unsynchronized timing"))
    candidates.append(("sparse_peak", 0.5,
                       f"the script divides by a 2:4-sparse peak ({2 * peak:g} TFLOP/s), twice the dense "
                       f"{peak:g}: its MFU reads half the true one"))
    if ratio is not None and abs(ratio - 1) <= MATCH_TOLERANCE:
        out.append(MisreportCause(AGREES, f"the printed {reported_pct:.1f}% agrees with the true "
                                          f"{true_pct:.1f}%", ev))
    else:
        matched = [c for c in candidates if ratio and abs(ratio / c[1] - 1) <= MATCH_TOLERANCE]
        for cause, predicted, text in matched:
            out.append(MisreportCause(cause, text, dict(ev, predicted_ratio=predicted)))
        if not matched:
            out.append(MisreportCause(
                "unexplained", f"the printed MFU is {ratio:.2f}× the true one; no known cause predicts that "
                               "(a different FLOP formula, tokens per step, or timing window)", ev))
            # The A100 constant still applies to any nanoGPT-derived script: say so when it does.
            if abs(a100 - 1) > MATCH_TOLERANCE and not own_peak:
                out.append(MisreportCause("a100_constant_possible", a100_text, dict(ev, predicted_ratio=a100)))
    if reported_pct > 100:
        out.append(_impossible(reported_pct, [e.cause for e in out]))
    return tuple(out)


def _impossible(reported_pct: float, causes: list[str] | None) -> MisreportCause:
    why = {
        "a100_constant": "it is measured against the A100's 312 TFLOP/s, not this GPU's peak",
        "a100_constant+unsynchronized_timing": "it uses the A100's peak and an unsynchronized step time",
        "unsynchronized_timing": "its step time is shorter than the GPU actually took",
    }
    reason = next((why[c] for c in (causes or []) if c in why),
                  "the step time or the FLOP count it uses is wrong")
    return MisreportCause(IMPOSSIBLE, f"{reported_pct:.1f}% MFU is impossible (above 100% of the peak): {reason}",
                          {"reported_pct": reported_pct})
