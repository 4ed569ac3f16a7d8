"""gpu_check's verdicts on one diagnose run: the GPU run (timeline, MFU, matmul ceiling, no
impossible figure), the CPU smoke run, TF32, CUDA graphs, the GPU spans and the compute fixes.

Pure: nothing here runs gpuprof or touches a GPU, so tests/benchmarks/test_gpu_check.py drives it
with synthetic profiles. The meters' verdicts are in gpu_check_verdicts_meters.py, the ranks' in
gpu_check_verdicts_ranks.py."""

from __future__ import annotations

from gpu_check_profile import Missing, _num, _value, finding_ids, lookup

PROBE_SHARE = (0.5, 1.0)  # measured matmul ceiling / datasheet peak (H200 bf16: ~650-800 of 989.5)


def judge_gpu_run(p) -> tuple[bool, str]:
    """A diagnose run on CUDA: GPU timeline, every event resolved, MFU in (0, 1], the bf16
    ceiling 50-100% of the datasheet peak, and the probe measured the MFU's dtype."""
    problems: list[str] = impossible_figures(p)
    tl = _value(p, "analysis.steps.timeline", problems)
    if tl is not None and tl != "gpu":
        problems.append(f"timeline is {tl!r}, not 'gpu'")
    gt = _value(p, "measurements.timer.gpu_timeline", problems)
    if gt is not None and gt is not True:
        problems.append(f"measurements.timer.gpu_timeline is {gt!r}")
    unresolved = _value(p, "measurements.timer.steps_unresolved", problems)  # the steps' indices
    if unresolved:
        n = len(unresolved) if isinstance(unresolved, list) else unresolved
        problems.append(f"{n:g} steps with unresolved CUDA events")
    step = _num(p, "analysis.steps.step_s", problems)
    mfu = _num(p, "analysis.mfu.mfu", problems)
    if mfu is not None and not 0 < mfu <= 1:
        problems.append(f"MFU {mfu:.3f} is outside (0, 1]")
    peak = _num(p, "analysis.mfu.peak_tflops", problems)
    ceiling = _num(p, "measurements.probe.tflops", problems)
    share = ceiling / peak if ceiling is not None and peak else None
    if share is not None and not PROBE_SHARE[0] <= share <= PROBE_SHARE[1]:
        problems.append(f"ceiling {ceiling:.0f} TFLOP/s is {share:.0%} of the {peak:g} TFLOP/s peak "
                        f"(expected {PROBE_SHARE[0]:.0%}-{PROBE_SHARE[1]:.0%})")
    mdt = _value(p, "analysis.mfu.dtype", problems)
    pdt = _value(p, "measurements.probe.dtype", problems)
    if mdt is not None and pdt is not None and mdt != pdt:
        problems.append(f"the probe measured {pdt}, the MFU uses {mdt}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"step {step * 1e3:.1f} ms (GPU timeline), MFU {mfu:.1%} of the {mdt} peak {peak:g} TFLOP/s, "
                  f"{mdt} ceiling {ceiling:.0f} TFLOP/s = {share:.0%} of peak")


def impossible_figures(p) -> list[str]:
    """gpuprof's own physical-bounds checker on a profile dict and the analysis saved with it:
    every impossible figure in them."""
    try:
        from gpuprof.analysis.bounds import violations
        from gpuprof.analysis.pipeline import Analysis
        from gpuprof.profile import from_data

        prof = from_data(p)
        stored = p.get("analysis")
        analysis = Analysis.from_dict(stored, prof) if isinstance(stored, dict) else None
        return [f"impossible figure: {v}" for v in violations(prof, analysis)]
    except Exception as exc:  # noqa: BLE001 - a profile the checker cannot read is itself a problem
        return [f"bounds check failed: {exc.__class__.__name__}: {exc}"]


def judge_cpu_run(p) -> tuple[bool, str]:
    """The smoke run's built-in loop on a CPU: host timeline, a step time, shares adding to 1."""
    problems: list[str] = impossible_figures(p)
    tl = _value(p, "analysis.steps.timeline", problems)
    if tl is not None and tl != "host":
        problems.append(f"timeline is {tl!r}, not 'host' on a CPU")
    step = _num(p, "analysis.steps.step_s", problems)
    if step is not None and step <= 0:
        problems.append(f"step_s {step}")
    phases = _value(p, "analysis.steps.phases", problems)
    total = sum(v.get("share", 0.0) for v in phases.values()) if isinstance(phases, dict) else None
    if total is not None and abs(total - 1) > 0.01:
        problems.append(f"phase shares add up to {total:.3f}")
    if not isinstance(lookup(p, "analysis.mfu"), dict):
        problems.append("key missing: analysis.mfu")
    if problems:
        return False, "; ".join(problems)
    return True, (f"cpu smoke: step {step * 1e3:.1f} ms (host timeline), shares sum to {total:.3f}; "
                  "the GPU figures are judged on CUDA only")


def judge_tf32(p, tf32_peak: float | None) -> tuple[bool, str]:
    """fp32 with TF32 allowed: the MFU is against the TF32 peak and the probe measured TF32."""
    problems: list[str] = []
    tf32 = _value(p, "measurements.precision.tf32_matmul", problems)
    if tf32 is not None and tf32 is not True:
        problems.append(f"measurements.precision.tf32_matmul is {tf32!r}, the fixture allows TF32")
    mdt = _value(p, "analysis.mfu.dtype", problems)
    if mdt is not None and mdt != "tf32":
        problems.append(f"MFU dtype is {mdt!r}, not 'tf32'")
    peak = _num(p, "analysis.mfu.peak_tflops", problems)
    if tf32_peak is None:
        problems.append("this GPU has no TF32 peak in gpuprof.hardware: nothing to compare")
    elif peak is not None and abs(peak - tf32_peak) > 1e-6:
        problems.append(f"MFU peak {peak:g} TFLOP/s is not the TF32 peak {tf32_peak:g}")
    pdt = _value(p, "measurements.probe.dtype", problems)
    if pdt is not None and pdt != "tf32":
        problems.append(f"the probe measured {pdt!r}, not 'tf32'")
    if problems:
        return False, "; ".join(problems)
    ceiling = lookup(p, "measurements.probe.tflops")
    ceil = f", TF32 ceiling {ceiling:.0f} TFLOP/s" if isinstance(ceiling, (int, float)) else ""
    return True, f"MFU dtype tf32 against the TF32 peak {peak:g} TFLOP/s, probe dtype tf32{ceil}"


def judge_cudagraphs(p) -> tuple[bool, str]:
    """torch.compile(mode="reduce-overhead") on the built-in loop: every measured step has a GPU
    timeline (the graph replays sit between the phase events; none was recorded during a
    capture), forward and backward take GPU time, and no sync is counted as the script's."""
    problems: list[str] = []
    timer = lookup(p, "measurements.timer")
    if isinstance(timer, Missing):
        return False, timer.why
    if timer.get("gpu_timeline") is not True or timer.get("steps_unresolved"):
        problems.append(f"GPU timeline incomplete: steps {timer.get('steps_unresolved')} ({timer.get('reasons')})")
    if timer.get("record_error"):
        problems.append(f"an event failed: {timer['record_error']}")
    steps = p.get("steps") or []
    if not steps:
        problems.append("no measured steps")
    for s in steps:
        g = s.get("gpu_phases") or {}
        if not (g.get("forward", 0) > 0 and g.get("backward", 0) > 0):
            problems.append(f"step {s.get('index')}: forward/backward GPU time {g.get('forward')!r}/{g.get('backward')!r}")
            break
    per_step = _num(p, "measurements.syncs.per_step", problems)
    if per_step is not None and per_step != 0:
        problems.append(f"{per_step:g} syncs per step counted as the loop's own (it makes none)")
    if problems:
        return False, "; ".join(problems)
    own = lookup(p, "measurements.syncs.torch_own_in_steps")
    return True, (f"{len(steps)} steps on the GPU timeline, 0 syncs of the loop's own"
                  f" ({own if not isinstance(own, Missing) else 'not measured'} of torch's own in the steps)")


def judge_compute_fixes(p, on_cuda: bool, layers: int = 2) -> tuple[bool, str]:
    """tests/fixtures/mingpt_train.py with attention by hand, vocabulary 50257 and AdamW not fused:
    each is seen and timed both ways (CUDA events on a GPU), and attention-by-hand is a finding.
    On a GPU the vocabulary and the optimizer may honestly be no finding (padding or fusing not
    faster here): the timings are what is checked, the figures are reported."""
    problems: list[str] = []
    k = lookup(p, "measurements.kernels")
    if isinstance(k, Missing):
        return False, k.why
    att = k.get("attention") or {}
    hand = att.get("by_hand") or []
    if len(hand) != layers:  # one by-hand attention per layer the run asked for
        problems.append(f"{len(hand)} attention layers by hand seen (the run has {layers})")
    clock = "CUDA events" if on_cuda else "wall time"
    for part, keys in (("attention", ("by_hand_forward_s", "sdpa_forward_s")), ("vocab", ("vocab_s", "padded_s")),
                       ("optimizer", ("current_s", "fused_s"))):
        t = (k.get(part) or {}).get("timing") or {}
        if any(not isinstance(t.get(x), (int, float)) or t[x] <= 0 for x in keys):
            problems.append(f"{part} not timed: {t.get('not_measured') or t}")
        elif clock not in (t.get("method") or ""):
            problems.append(f"{part} timed without {clock}: {t.get('method')}")
    if "attention-by-hand" not in finding_ids(p):
        problems.append("no attention-by-hand finding")
    bad = impossible_figures(p)
    if bad:
        problems.append("impossible figures: " + "; ".join(bad))
    if problems:
        return False, "; ".join(problems)
    t = att["timing"]
    return True, (f"attention by hand {t['by_hand_forward_s'] + t['by_hand_backward_s']:.4g} s vs SDPA "
                  f"{t['sdpa_forward_s'] + t['sdpa_backward_s']:.4g} s per layer; findings: "
                  + ", ".join(i for i in finding_ids(p) if i in ("attention-by-hand", "vocab-not-padded",
                                                                 "optimizer-not-fused", "optimizer-slow")))


SPAN_TOLERANCE_S = 2e-6  # spans are stored rounded to 0.1 µs


def judge_gpu_spans(p) -> tuple[bool, str]:
    """Per measured step, the GPU spans (in the order the GPU ran them) add up to the GPU phase
    totals and lie inside the step's GPU time, in order and without overlap."""
    problems: list[str] = []
    steps = [s for s in (p.get("steps") or []) if s.get("gpu_phases")]
    if not steps:
        return False, "no step with GPU phases"
    n_spans = 0
    for s in steps:
        spans = (s.get("extra") or {}).get("gpu_spans")
        i = s.get("index")
        if not spans:
            problems.append(f"step {i}: no gpu_spans")
            continue
        n_spans += len(spans)
        tol = SPAN_TOLERANCE_S * (len(spans) + 1)
        sums: dict = {}
        end = 0.0
        for label, start, dur in spans:
            sums[label] = sums.get(label, 0.0) + dur
            if start < end - tol or dur < 0:
                problems.append(f"step {i}: span {label} at {start} overlaps the one before (ends {end})")
            end = start + dur
        if end > (s.get("gpu_s") or 0) + tol:
            problems.append(f"step {i}: spans end at {end:.6f} s, after the step's GPU time {s.get('gpu_s')}")
        for label, total in (s.get("gpu_phases") or {}).items():
            if abs(sums.get(label, 0.0) - total) > tol:
                problems.append(f"step {i}: {label} spans sum to {sums.get(label, 0.0):.7f} s, phase total {total:.7f} s")
    if problems:
        return False, "; ".join(problems[:5])
    return True, f"{len(steps)} steps, {n_spans} GPU spans: each step's spans add up to its phases, in order, inside the step"
