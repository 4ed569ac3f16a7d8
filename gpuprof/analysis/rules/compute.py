"""Rules about what the compute could do differently, each from a pair timed after the run
(measure/kernels.py): attention by hand vs SDPA (attention-by-hand; attention-need-weights when it is
torch's nn.MultiheadAttention called with need_weights=True), the SDPA kernel torch chose
on a GPU (attention-backend), the vocabulary padded to a multiple of 64 (vocab-not-padded), and
Adam/AdamW with fused=True (optimizer-not-fused).

Each pair was timed in paired rounds with the interval of its ratio (changed way ÷ run's way,
measure/pair_rounds.py); a saving is that ratio applied to the part of the step the change scales
(the by-hand attention time: layers × micro-steps, each part capped by its phase; the output layer
× micro-steps; the optimizer step, at most its phase), and claimed as the interval supports
(rules/intervals.py `timed_saving`, as precision-slow): an interval that excludes no change gives
the saving with the interval in the evidence and a confidence from it; one that holds no change
gives information, no saving and no config change ("within this machine's noise"); a profile
written before paired rounds (best of each way) gives the point figure at confidence low. A saving
whose estimate and interval both lie under CLAIM_SHARE of the step is reported as information,
without a saving (intervals.under_share: an estimate under it whose interval reaches it is claimed)."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import micro_steps, mode, on_cuda, step_s
from gpuprof.analysis.rules.experiments import measured_on_loop, on_your_loop, slower_finding
from gpuprof.analysis.rules.intervals import TimedSaving, interval_of, says_slower, timed_saving, under_share
from gpuprof.sections.compute import AttentionCall
from gpuprof.units import count, join_notes, pct, seconds, times

CLAIM_SHARE = 0.05  # a saving shown under 5% of the step (interval too) is not claimed (issue #21's bar)
OPTIMIZER_SLOW_SHARE = 0.10  # optimizer-slow's own threshold (rules/gpu.py): it carries the fused timing


def _split(saving: float, ctx: Context) -> dict:
    """A saving out of forward+backward, split as the run's own forward and backward times."""
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    if fwd + bwd <= 0:
        return {}
    return {"forward": saving * fwd / (fwd + bwd), "backward": saving * bwd / (fwd + bwd)}


def _small(saving: float, total: float) -> str:
    return (f"measured {seconds(saving)} per step, {pct(saving / total)} of the step: under "
            f"{CLAIM_SHARE:.0%}, so no saving is claimed on this device")


def outcome(timed: TimedSaving, total: float, share: float = CLAIM_SHARE) -> str:
    """What a timed saving supports: "slower" (the measurement says the changed way is slower:
    intervals.says_slower — never offered as a fix), "noise" (its interval holds no change),
    "small" (under `share` of the step and so is its interval's top, intervals.under_share; or a point
    figure ≤ 0 too small to say slower) or "claim"."""
    if says_slower(timed, total):
        return "slower"
    if timed.within_noise:
        return "noise"
    return "small" if under_share(timed, total, share) else "claim"


def ratio_of(timing, point: float) -> float:
    """The changed way ÷ the run's way: the paired rounds' estimate, else the point figure."""
    iv = interval_of(timing.interval)
    return iv.estimate if iv is not None else point


def medians(timing) -> str:
    """", the medians of n paired rounds" when the timing has them, else ""."""
    return f", the medians of {timing.rounds} paired rounds" if timing.interval is not None and timing.rounds else ""


def attention_by_hand(ctx: Context) -> list[Finding]:
    """Attention computed by hand (q·kᵀ, mask, softmax, dropout, ·v) in the user's own code, where
    F.scaled_dot_product_attention would run a fused kernel. Saving: first, when it ran, the
    script's own steps with the attention through SDPA (experiment steps: measure/attention_switch.py)
    against as it runs, in pairs; otherwise the model (or its layers) timed both ways after the run in
    paired rounds: the by-hand time × micro-steps (× the layers of that shape when timed alone; each
    part capped by the run's own phase) × (1 − SDPA ÷ by hand, forward and backward net). Claimed as
    its interval supports. torch's own modules are attention_need_weights."""
    calls = [c for c in ctx.sections.kernels.attention.by_hand if not c.torch_module]
    exp = measured_on_loop(ctx, "attention:sdpa")
    if not calls and exp is not None:  # the post-run op trace did not run: the experiment's own
        calls = [AttentionCall.from_dict(c) for c in exp.calls if isinstance(c, dict)]
    if not calls:
        return []
    first, n, where = calls[0], len(calls), _where(calls, "module", "the model")
    args = ["q, k, v"]
    if first.masked and first.causal is not False:
        args.append("is_causal=True")
    elif first.masked:
        args.append("attn_mask=mask (True where attended)")
    if first.dropout_p:
        args.append("dropout_p=self.dropout if self.training else 0.0")
    fix = (f"y = F.scaled_dot_product_attention({', '.join(args)}) in place of q @ k.transpose(-2, -1), "
           f"masked_fill, softmax{', dropout' if first.dropout_p else ''} and @ v ({where})")
    seen = (f"{n} attention layer{'s' if n > 1 else ''} compute softmax(q·kᵀ)·v by hand ({where}), "
            f"at (B, H, T, head dim) = ({_dims(first)}) in {first.dtype}")
    if exp is not None:
        return _attention_on_loop(ctx, exp, calls, f"attention computed by hand in {where}", fix, seen)
    timing = ctx.sections.kernels.attention.timing
    ways = (("the model's forward+backward", "as it runs", "with its attention through SDPA")
            if timing.per == "model" else ("one layer, forward+backward", "by hand", "through SDPA"))
    return _timed_attention(ctx, calls, "attention-by-hand", f"attention computed by hand in {where}", fix, seen,
                            ways=ways)


def attention_need_weights(ctx: Context) -> list[Finding]:
    """torch's nn.MultiheadAttention called with need_weights=True (its default when a user calls
    it): torch then computes softmax(q·kᵀ)·v by hand (bmm, softmax) to return the weights, where
    need_weights=False runs F.scaled_dot_product_attention inside it. The fix is at the user's
    call site, never in torch's code; the saving is nn.MultiheadAttention timed both ways (the
    kernels section's mha_timing), scaled as attention_by_hand's."""
    calls = [c for c in ctx.sections.kernels.attention.by_hand if c.torch_module]
    if not calls:
        return []
    first, n = calls[0], len(calls)
    site, where = _where(calls, "call_site", "your call"), _where(calls, "module", "the model")
    fix = (f"pass need_weights=False in the {first.torch_module} call at {site} ({where}): torch then runs "
           f"F.scaled_dot_product_attention inside it; keep need_weights=True only on a call whose "
           f"attention weights you use")
    seen = (f"{n} {first.torch_module} call{'s' if n > 1 else ''} at {site} ({where}) run with need_weights=True, "
            f"so torch computes softmax(q·kᵀ)·v by hand (bmm, softmax) to return the weights, at (B, H, T, head "
            f"dim) = ({_dims(first)}) in {first.dtype}")
    return _timed_attention(ctx, calls, "attention-need-weights",
                            f"{first.torch_module} computes attention by hand (need_weights=True) at {site}", fix, seen,
                            timing=ctx.sections.kernels.attention.mha_timing,
                            ways=("the model's forward+backward", "as it runs", "with need_weights=False"))


def _attention_on_loop(ctx: Context, exp, calls: list, title: str, fix: str, seen: str) -> list[Finding]:
    """attention-by-hand from the experiment steps (measure/attention_switch.py): the script's own
    steps with its attention computed through SDPA against as it runs, in pairs."""
    total = step_s(ctx)
    ts = on_your_loop(exp, total)
    first = calls[0]
    ev = {"layers": len(calls), "module": first.module, "shape": list(first.shape), "dtype": first.dtype,
          "causal": first.causal, "dropout_p": first.dropout_p, "ratio": exp.ratio, "measured_saving_s": ts.estimate,
          **ts.evidence}
    because = (f"{seen}; measured on your loop: {exp.pairs} paired steps, the step took {seconds(exp.b_median_s)} with "
               f"the attention through SDPA and {seconds(exp.a_median_s)} as it runs (medians; {times(exp.ratio)} the "
               f"time; the model's loss both ways checked equal first)")
    verdict = outcome(ts, total)
    if verdict == "slower":
        return [slower_finding("attention-by-hand", "SDPA in place of the attention by hand", exp, ts, total)]
    memory = _memory(first)
    if verdict != "claim":
        note = ts.note if verdict == "noise" else join_notes(_small(ts.estimate, total), ts.note)
        return [Finding(id="attention-by-hand", title=title, saving_s=None, evidence=ev, confidence=ts.confidence,
                        kind="info", fix=fix, because=because, note=join_notes(note, memory.removeprefix("; ")))]
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    saving = ts.saving_s
    save_f = min(saving * fwd / (fwd + bwd), fwd) if fwd + bwd else 0.0
    save_b = min(saving - save_f, bwd)
    return [Finding(
        id="attention-by-hand", title=f"{title}: through SDPA your step ran in {times(exp.ratio)} the time",
        saving_s=saving, evidence=ev, confidence=ts.confidence, fix=fix, because=because,
        note=join_notes(ts.note, memory.removeprefix("; ")),
        claims={k: v for k, v in (("forward", save_f), ("backward", save_b)) if v > 0},
    )]


def _memory(first) -> str:
    """"; SDPA's fused kernels also never store ..." for the first by-hand call's shape, else ""."""
    b, h, t, d = (list(first.shape) + [None] * 4)[:4]
    stored = (b or 0) * (h or 0) * (t or 0) ** 2
    return (f"; SDPA's fused kernels also never store the (B, H, T, T) attention matrix: "
            f"{count(stored)} values per layer here" if stored else "")


def _where(calls, attr: str, none: str) -> str:
    """The first of the calls' modules (or call sites) and how many more, in words."""
    names = sorted({getattr(c, attr) for c in calls if getattr(c, attr)})
    return f"{names[0]} and {len(names) - 1} more" if len(names) > 1 else (names[0] if names else none)


def _dims(call) -> str:
    return ", ".join(map(str, (list(call.shape) + [None] * 4)[:4]))


def _timed_attention(ctx: Context, calls: list, fid: str, title: str, fix: str, seen: str, timing=None,
                     ways=("one layer, forward+backward", "by hand", "through SDPA")) -> list[Finding]:
    """The finding for attention layers computed by hand (`calls`), with the saving the timing of
    the two ways supports (`timing`: the kernels section's `timing` by default; `ways`: what one
    unit and each way are, in words): it covers the layers of its shape and dtype."""
    att = ctx.sections.kernels.attention
    first = calls[0]
    memory = _memory(first)
    ev = {"layers": len(calls), "module": first.module, "shape": list(first.shape), "dtype": first.dtype,
          "causal": first.causal, "dropout_p": first.dropout_p}
    if first.call_site:
        ev["call_site"] = first.call_site
    timing = att.timing if timing is None else timing
    total = step_s(ctx)
    # the layers of the timed shape and dtype (a timing without them: the first layer's, as kept
    # by profiles before torch's own modules were told apart)
    per_model = timing.per == "model"  # the whole model timed both ways: every layer is in it
    timed = (calls if per_model else
             [c for c in calls if list(c.shape) == list(timing.shape) and c.dtype == timing.dtype]
             if timing.shape else calls[:att.timed_layers or len(calls)])
    if timing.by_hand_forward_s is None or timing.sdpa_forward_s is None or not total or not timed:
        why = timing.not_measured or ("the layers timed had another shape" if timing.by_hand_forward_s is not None
                                      else "the layer was not timed")
        return [Finding(id=fid, title=title, saving_s=None, evidence=ev, confidence="medium",
                        fix=fix, note=f"not estimated: {why}{memory}", because=seen)]
    layers = len(timed)
    micro = micro_steps(ctx)
    times_each = micro * (1 if per_model else layers)
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    hand = timing.by_hand_forward_s + timing.by_hand_backward_s
    fused = timing.sdpa_forward_s + timing.sdpa_backward_s
    # The part of the step the change scales: the run's by-hand time, each part capped by its phase.
    part_f = min(timing.by_hand_forward_s * times_each, fwd)
    part_b = min(timing.by_hand_backward_s * times_each, bwd)
    ratio = ratio_of(timing, fused / hand if hand else 1.0)
    ts = timed_saving(timing.interval, part_f + part_b, ratio)
    ev.update(by_hand_layer_s=hand, sdpa_layer_s=fused, timed_layers=layers, micro_steps=micro,
              attention_s=part_f + part_b, ratio=ratio, measured_saving_s=ts.estimate, **ts.evidence)
    unit, way_a, way_b = ways
    scale = "" if per_model else f" × {layers} layer{'s' if layers > 1 else ''}"
    capped = " (capped by the run's phases)" if part_f + part_b < hand * times_each else ""
    because = (f"{seen}; {unit}, took {seconds(hand)} {way_a} and {seconds(fused)} {way_b} "
               f"({times(ratio)} the time{medians(timing)});{scale} × {micro} micro-step{'s' if micro > 1 else ''} = "
               f"{seconds(part_f + part_b)} per step {way_a}{capped}, so {seconds(ts.estimate)} per step")
    verdict = outcome(ts, total)
    if verdict != "claim":
        note = {"noise": ts.note, "small": _small(ts.estimate, total),
                "slower": f"measured: {way_b} was not faster here, so no saving is claimed on this device"}[verdict]
        return [Finding(id=fid, title=title, saving_s=None, evidence=ev, confidence=ts.confidence,
                        kind="info", fix="" if verdict == "slower" else fix, because=because,
                        note=join_notes(note, ts.note if verdict != "noise" else "", memory.removeprefix("; ")))]
    saving = ts.saving_s
    # Split over forward and backward where the gain was (a part that got slower gains nothing),
    # each part at most its phase.
    gain_f = max(0.0, timing.by_hand_forward_s - timing.sdpa_forward_s)
    gain_b = max(0.0, timing.by_hand_backward_s - timing.sdpa_backward_s)
    share_f = gain_f / (gain_f + gain_b) if gain_f + gain_b else part_f / (part_f + part_b)
    save_b = min(saving * (1 - share_f), bwd)
    save_f = min(saving - save_b, fwd)
    save_b = min(saving - save_f, bwd)
    return [Finding(
        id=fid, title=f"{title}: {way_b.removeprefix('through ')} ran it in {times(ratio)} the time",
        saving_s=saving, evidence=ev, confidence=ts.confidence, fix=fix,
        note=join_notes(ts.note, "estimate: " + (
            "the model timed after the run both ways on the run's micro-batch, × micro-steps" if per_model else
            "the layers timed after the run both ways at the run's shapes, scaled by layers and micro-steps"),
            memory.removeprefix("; ")),
        because=because, claims={k: v for k, v in (("forward", save_f), ("backward", save_b)) if v > 0},
    )]


def attention_backend(ctx: Context) -> list[Finding]:
    """SDPA calls on a GPU that ran the math fallback or the memory-efficient kernel where
    torch's checker refused flash: information with torch's own reasons (dtype, head dim, mask,
    dropout). No saving: the change (a dtype, a head dim) is the user's choice."""
    if not on_cuda(ctx):
        return []
    calls = [c for c in ctx.sections.kernels.attention.sdpa if c.backend not in ("flash", "cudnn", None)]
    if not calls:
        return []
    first = calls[0]
    reasons = list(first.refused) or ["torch gave no reason"]
    return [Finding(
        id="attention-backend",
        title=f"attention runs SDPA's {first.backend} kernel, not flash ({len(calls)} call{'s' if len(calls) > 1 else ''})",
        saving_s=None, kind="info", confidence="high",
        evidence={"backend": first.backend, "calls": len(calls), "shape": list(first.shape), "dtype": first.dtype,
                  "refused": reasons},
        because=(f"{len(calls)} F.scaled_dot_product_attention call{'s' if len(calls) > 1 else ''} at "
                 f"{tuple(first.shape)} in {first.dtype} ran the {first.backend} kernel; torch refused flash: "
                 + "; ".join(reasons)),
        note="not estimated: flash needs fp16/bf16 and a head dim it supports; the reasons are torch's own",
        fix="meet flash's conditions where the model allows (bf16 autocast, head dim a multiple of 8, ≤ 256)",
    )]


def vocab_not_padded(ctx: Context) -> list[Finding]:
    """A vocabulary that is not a multiple of 64 (GPT-2's 50257), where the output projection
    and loss run measurably faster at the padded size on this device. Saving: the output layer's
    time at V × micro-steps (at most forward+backward) × (1 − padded ÷ V, the paired rounds'
    ratio), split over forward and backward as the run's; within noise, information without a
    saving. No finding where padding is not faster."""
    v = ctx.sections.kernels.vocab
    if not v.vocab or not v.multiple or v.vocab % v.multiple == 0:
        return []
    to = v.padded_vocab
    extra = to - v.vocab
    overrides = {"vocab_size": to} if mode(ctx) == "builtin" else {}
    fix = (f"vocab_size = {to} (the model's config, e.g. GPTConfig(vocab_size={to})): {v.vocab} padded to a "
           f"multiple of {v.multiple}; the {extra} extra logits are never a target and training pushes them down")
    ev = {"vocab": v.vocab, "padded_vocab": to, "module": v.module}
    timing = v.timing
    total = step_s(ctx)
    title = f"vocabulary of {v.vocab} is not a multiple of {v.multiple}"
    if timing.vocab_s is None or timing.padded_s is None or not total:
        return [Finding(id="vocab-not-padded", title=title,
                        saving_s=None, evidence=ev, fix=fix, config_overrides=overrides,
                        confidence="low", because=f"{v.module or 'the output projection'} produces {v.vocab} logits",
                        note=f"not estimated: {timing.not_measured or 'not timed'}")]
    micro = micro_steps(ctx)
    ratio = ratio_of(timing, timing.padded_s / timing.vocab_s if timing.vocab_s else 1.0)
    part = min(timing.vocab_s * micro, ctx.seconds("forward") + ctx.seconds("backward"))
    ts = timed_saving(timing.interval, part, ratio)
    verdict = outcome(ts, total)
    if verdict == "slower":
        return []  # padding does not help on this device
    ev.update(vocab_s=timing.vocab_s, padded_s=timing.padded_s, tokens=timing.tokens, micro_steps=micro,
              output_layer_s=part, ratio=ratio, measured_saving_s=ts.estimate, **ts.evidence)
    because = (f"the output projection and loss, forward+backward at {count(timing.tokens)} tokens, took "
               f"{seconds(timing.vocab_s)} with {v.vocab} logits and {seconds(timing.padded_s)} with {to} "
               f"({times(ratio)} the time{medians(timing)}, for {extra} more logits); × {micro} "
               f"micro-step{'s' if micro > 1 else ''} = {seconds(part)} per step, so {seconds(ts.estimate)} per step")
    if verdict != "claim":
        noise = verdict == "noise"
        return [Finding(id="vocab-not-padded", title=title, saving_s=None, evidence=ev, fix=fix,
                        config_overrides={} if noise else overrides, kind="info", confidence=ts.confidence,
                        because=because, note=ts.note if noise else join_notes(_small(ts.estimate, total), ts.note))]
    return [Finding(
        id="vocab-not-padded",
        title=f"{title}: {to} runs the output layer in {times(ratio)} the time",
        saving_s=ts.saving_s, evidence=ev, confidence=ts.confidence, fix=fix,
        config_overrides=overrides, because=because,
        note=join_notes(ts.note, "estimate: the output projection and loss timed after the run at both sizes"),
        claims=_split(ts.saving_s, ctx),
    )]


def fused_optimizer_saving(ctx: Context) -> tuple[TimedSaving, str, dict] | None:
    """(the timed saving per step, the words, evidence) from the fused-optimizer timing, or None
    when it was not measured: the copy's step as configured, at most the run's optimizer phase,
    × (1 − fused ÷ as configured, the paired rounds' ratio with its interval; a profile before
    them: the best of each), through rules/intervals.timed_saving.

    Not the ratio applied to the run's phase: on the benchmark's script (benchmarks/compute_fixes.py)
    the run's for-loop phase was 25 ms where the plain script's is ~21 ms (by subtraction), likely
    gpuprof's samplers taking the GIL from a Python-bound loop; the ratio then over-predicted
    (1.29×). The copy is timed after the run with the samplers stopped, as the script runs
    without gpuprof; the phase only caps it."""
    exp = measured_on_loop(ctx, "optimizer:fused")
    if exp is not None and step_s(ctx):  # fused=True switched on in the script's own loop: that, first
        ts = on_your_loop(exp, step_s(ctx))
        words = (f"measured on your loop: {exp.pairs} paired steps, the step took {seconds(exp.b_median_s)} with "
                 f"fused=True and {seconds(exp.a_median_s)} as configured (medians; {times(exp.ratio)} the time)")
        return ts, words, {"ratio": exp.ratio, "measured_saving_s": ts.estimate, **ts.evidence}
    o = ctx.sections.kernels.optimizer
    t = o.timing
    if o.mode in (None, "fused") or not t.current_s or t.fused_s is None:
        return None
    phase = ctx.seconds("optimizer")
    ratio = ratio_of(t, t.fused_s / t.current_s)
    part = min(t.current_s, phase)
    ts = timed_saving(t.interval, part, ratio)
    words = (f"one {o.class_} step on a copy of the {count(t.parameters)} parameters took {seconds(t.current_s)} "
             f"as configured ({o.mode}) and {seconds(t.fused_s)} with fused=True ({times(ratio)} the "
             f"time{medians(t)}); the run's optimizer phase is {seconds(phase)} per step")
    return ts, words, {"optimizer_mode": o.mode, "current_step_s": t.current_s, "fused_step_s": t.fused_s,
                       "ratio": ratio, "measured_saving_s": ts.estimate, **ts.evidence}


def optimizer_not_fused(ctx: Context) -> list[Finding]:
    """Adam/AdamW stepping for-loop or foreach where fused=True is available for its parameters,
    timed both ways on a copy. Where optimizer-slow fires (CUDA, ≥ 10% of the step) it carries
    this measurement instead (rules/gpu.py)."""
    total = step_s(ctx)
    measured = fused_optimizer_saving(ctx)
    if measured is None or not total:
        return []
    if on_cuda(ctx) and ctx.seconds("optimizer") / total >= OPTIMIZER_SLOW_SHARE:
        return []  # optimizer-slow's finding
    ts, words, ev = measured
    o = ctx.sections.kernels.optimizer
    exp = measured_on_loop(ctx, "optimizer:fused")
    name = o.class_ or "the optimizer"
    fix = exp.fix if exp is not None and exp.fix else f"torch.optim.{name}(..., fused=True)"
    verdict = outcome(ts, total)
    if verdict == "slower":
        return [slower_finding("optimizer-not-fused", fix, exp, ts, total)] if exp else []
    title = f"{name} is not fused ({o.mode or 'foreach or for-loop'})"
    if verdict != "claim":
        return [Finding(id="optimizer-not-fused", title=title, saving_s=None, evidence=ev, fix=fix, kind="info",
                        confidence=ts.confidence, because=words,
                        note=ts.note if verdict == "noise" else join_notes(_small(ts.estimate, total), ts.note))]
    return [Finding(
        id="optimizer-not-fused", title=f"{title}: fused=True steps in {times(ev['ratio'])} the time",
        saving_s=ts.saving_s, evidence=ev, confidence=ts.confidence, fix=fix, because=words,
        note=ts.note if exp is not None else join_notes(ts.note, "estimate: one step of a copy of the parameters "
                                                                  "timed both ways after the run"),
        claims={"optimizer": ts.saving_s},
    )]


def activation_checkpointing(ctx: Context) -> list[Finding]:
    """Activation checkpointing seen in a script: module forwards that ran inside the backward
    (the hooks count them: every module call of a recomputed region). Information: what the
    recomputation costs is estimated from the usual backward ≈ 2× forward (the excess of the
    backward over twice the forward), not timed; the memory it saves is not estimated (the memory
    model has no checkpointing). No saving: turning it off trades memory for that time, the
    user's choice."""
    script = ctx.sections.script
    n = script.count("forward_in_backward")
    if not n:
        return []
    backwards = script.count("backward") or None
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    excess = max(0.0, bwd - 2 * fwd)
    ev = {"module_calls_in_backward": n, "backward_calls": backwards, "forward_s": fwd, "backward_s": bwd,
          "recompute_estimate_s": excess}
    per = f", {n / backwards:.1f} per backward" if backwards else ""
    because = (f"{count(n)} module calls ran inside the backward over the run{per}: a checkpointed region's "
               f"forward recomputed; backward {seconds(bwd)} and forward {seconds(fwd)} per step "
               f"({bwd / fwd:.1f}× where about 2× is usual)" if fwd else
               f"{count(n)} module calls ran inside the backward over the run{per}")
    if fwd and excess > 0:
        note = (f"the recomputation is about {seconds(excess)} per step (the backward's excess over 2× the forward: "
                "an estimate from the usual ratio, not timed); the memory it saves is not estimated")
    elif fwd:
        note = ("the backward is not above 2× the forward here, so the ratio shows no recomputation cost "
                "(not timed); the memory it saves is not estimated")
    else:
        note = "the recomputation's time and the memory it saves are not estimated"
    return [Finding(
        id="activation-checkpointing", title="activation checkpointing recomputes forwards inside the backward",
        saving_s=None, kind="info", confidence="medium", evidence=ev, because=because,
        note=note, fix=("keep it where the memory is needed; where the batch fits without it, turning it off "
                        "(e.g. HF model.gradient_checkpointing_disable()) saves the recomputation"),
    )]
