"""Rules about what torch.compile reported during the run (measurements.dynamo, read by
measure/dynamo.py from dynamo's own records): a graph break in the compiled code (graph-break),
recompilations during the measured steps (recompile) and before them (recompile-warmup, information),
a function dynamo gave up compiling after too many recompilations (recompile-limit). Pure: no torch
import.

None of them estimates a saving: what a break costs (the pieces' extra launches, the fusion lost
across the split) and what a recompilation costs a typical step were not measured in the run;
each finding's note says so."""

from __future__ import annotations

import re

from gpuprof.analysis.findings import Context, Finding
from gpuprof.sections.dynamo import DynamoSection, GraphBreak, Recompile
from gpuprof.units import join_notes, seconds

_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")  # dynamo's code after a graph break
MAX_BREAK_FINDINGS = 10  # break places reported (the user's code first, then the most met)

BREAK_NOTE = ("not estimated: a graph break splits the compiled code into separate graphs with Python "
              "run eagerly between them; its cost is the pieces' extra kernel launches and the fusion "
              "lost across the split, which this run did not measure (a run with the break removed "
              "measures it)")


def _dynamo(ctx: Context) -> DynamoSection | None:
    sec = ctx.sections.dynamo
    return sec if sec.present and not sec.not_measured else None


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# ------------------------------------------------------------------------------ graph breaks
def _break_fix(b: GraphBreak) -> str:
    """The change for a break, matched to dynamo's reason; otherwise dynamo's own hint."""
    # dynamo's hints are generic (every builtin's mention print), so only its reason is matched
    text = " ".join(x for x in (b.reason, b.explanation) if x).lower()
    explanation = b.explanation or ""
    # the call dynamo names first ("builtin operator `print`", "the Python builtin `_warnings.warn`")
    named = re.search(r"`([^`]+)`", explanation)
    callee = named.group(1).rstrip(".") if named else ""
    if "graph_break()" in text and "user-inserted" in text:
        return "remove the torch._dynamo.graph_break() call"
    if re.search(r"tensor\.item\(\)|\.item\(\)|capture_scalar_outputs|scalar output", text):
        return ("torch._dynamo.config.capture_scalar_outputs = True (set before the first compiled call), "
                "or move the data-dependent check (the .item() and what reads it) out of forward, "
                "outside the compiled model")
    if re.search(r"data-dependent (branching|control flow)|generic_jump|jump with tensorvariable|dynamic control flow", text):
        return ("make the branch a tensor operation (torch.where, or torch.cond for two code paths), or move "
                "the data-dependent check out of forward, outside the compiled model")
    if re.search(r"^(builtins\.)?print$|logging|logger|warn", callee, re.IGNORECASE):
        return ("remove the print/logging/warnings call from forward (log outside the compiled model, e.g. "
                "every log_interval steps)")
    if re.search(r"marked as skipped|builtin|third-party|c extension|c/c\+\+|pybind|not supported|unsupported", text):
        what = f" ({callee})" if callee else ""
        return (f"move the unsupported call{what} out of forward, or put it in a helper decorated with "
                "@torch.compiler.disable (it then runs eagerly, as one break, without stopping the rest "
                "of forward from compiling)")
    hint = b.hints[0] if b.hints else None
    return f"see dynamo's reason; its hint: {hint}" if hint else "see dynamo's reason (and the graph-break page it links)"


def graph_breaks(ctx: Context) -> list[Finding]:
    """One finding per place dynamo split the compiled code (graph-break), with dynamo's reason and
    a fix matched to it. Reported whenever the run met it, warm-up included: dynamo meets a break
    while compiling (mostly in the first step), and the compiled code keeps the split on every
    later call. Saving not estimated (see BREAK_NOTE)."""
    sec = _dynamo(ctx)
    if sec is None or not sec.breaks:
        return []
    places: dict = {}
    for b in sec.breaks:  # one per place and reason (the instrument already groups them)
        key = (b.file, b.line, b.reason)
        if key in places:
            places[key] = (places[key][0], places[key][1] + (b.count or 1))
        else:
            places[key] = (b, b.count or 1)
    ranked = sorted(places.values(), key=lambda p: (not p[0].user_code, -p[1]))
    out = []
    n_places = len(ranked)
    for b, count in ranked[:MAX_BREAK_FINDINGS]:
        where = b.where or (f"{b.file}:{b.line}" if b.file else "an unknown place")
        reason = b.reason or "no reason given"
        if b.eager_fallback:
            because = (f"dynamo could not resume after the break at {where} (met {_times(count)} while "
                       f"compiling) and runs the whole function eagerly, uncompiled: {reason}")
        else:
            because = (f"dynamo split the compiled code at {where} (met {_times(count)} while compiling; the "
                       f"split is in every later call): {reason}")
        if b.explanation:
            because += f"; {b.explanation.rstrip('.')}"
        if b.dynamo_file and b.dynamo_line is not None:
            because += f" (inside torch at {b.dynamo_file}:{b.dynamo_line}, reached from {where})"
        if sec.graphs is not None and sec.frames is not None:
            because += (f". The run compiled {sec.graphs} graph{_s(sec.graphs)} from {sec.frames} "
                        f"frame{_s(sec.frames)}")
        note = BREAK_NOTE
        if n_places > MAX_BREAK_FINDINGS and len(out) == MAX_BREAK_FINDINGS - 1:
            note += f"; {n_places - MAX_BREAK_FINDINGS} more break places in measurements.dynamo.breaks"
        out.append(Finding(
            id="graph-break",
            title=(f"torch.compile graph break at {where}: {reason}"
                   + (" (the whole function runs eagerly)" if b.eager_fallback else "")),
            saving_s=None,
            evidence={"file": b.file, "line": b.line, "reason": reason, "explanation": b.explanation,
                      "count": count, "user_code": b.user_code, "eager_fallback": b.eager_fallback, "step_index": b.step_index,
                      "graphs": sec.graphs, "frames": sec.frames, "gb": b.gb, "hints": list(b.hints)},
            confidence="high", kind="fix", fix=_break_fix(b), note=note, because=because,
        ))
    return out


# ---------------------------------------------------------------------------- recompilations
def _measured_indices(ctx: Context, sec: DynamoSection):
    """(step index -> measured?) : the profile's measured steps; else the run's warm-up count."""
    measured = {s.index for s in ctx.profile.steps}
    if measured:
        return lambda i: i is not None and i in measured
    warm = sec.warmup if sec.warmup is not None else len(ctx.profile.warmup_steps)
    return lambda i: i is not None and i >= warm


def _guard_kind(guard: str) -> str:
    g = guard.lower()
    if re.search(r"size mismatch|stride mismatch|dimensionality|\bndim\b|\.size\(\)|\.shape", g):
        return "shape"
    if "grad_mode" in g or "global_state" in g:
        return "grad_mode"
    if ".training" in g:
        return "training"
    if re.search(r"___check_obj_id|___check_type_id|\bid\(|type\(", g):
        return "object"
    if "==" in g:
        return "value"
    return "other"


def _recompile_fix(r: Recompile, guard: str) -> str:
    kind = _guard_kind(guard)
    name = re.match(r"\s*(?:tensor\s+)?'?([\w.\[\]'\"]+?)'?\s", guard)
    named = name.group(1) if name else "the guarded value"
    if kind == "shape":
        return (f"the shape of {named} changed between calls: keep it constant (a fixed batch and block size; "
                "drop_last=True for a last partial batch), or mark the changing dimension dynamic: "
                f"torch._dynamo.mark_dynamic({named}, dim) before the call, or torch.compile(model, dynamic=True)")
    if kind in ("grad_mode", "training"):
        mode = "torch.no_grad()" if kind == "grad_mode" else "model.eval()/model.train()"
        return (f"the model was called under another mode ({mode}), e.g. an evaluation: dynamo compiles one "
                "graph per mode, once; keep evaluation out of the measured steps, or evaluate with the "
                "uncompiled model (model._orig_mod)")
    if r.resume_of is not None:
        return (f"the value carried across the graph break at line {r.resume_of.get('line')} of "
                f"{r.resume_of.get('function')} (e.g. an .item() result) was baked into the code compiled after "
                "it, so a new value recompiled it: remove that graph break (see graph-break)")
    if kind == "value":
        return (f"{named} is a Python value dynamo baked into the graph and it changed: keep it constant "
                "between calls, or pass it as a tensor so it is an input, not a constant")
    if kind == "object":
        return f"{named} was a different object (or type) than when compiled: pass the same object each call"
    return f"keep what the guard checks constant between calls (guard: {guard})"


def _function_words(r: Recompile) -> str:
    if r.resume_of is not None:
        return f"the part of {r.resume_of.get('function')} after its graph break"
    if r.function == "inner" and not r.user_code:
        return "the compiled module"
    return r.function or "a function"


def recompiles(ctx: Context) -> list[Finding]:
    """recompile: dynamo recompiled code during the measured steps, one finding per recompiled
    function, naming the guard that failed. Recompilations in warm-up give no finding: the first
    steps compile anyway and are kept out of the measured steps (compile-warmup covers their
    time); a guard that keeps failing shows again in the measured steps. Saving not estimated:
    dynamo's compile time in the measured steps is in the evidence, but the typical step the
    report prints need not contain it, and whether it recurs in a longer run depends on how often
    the guarded value changes.

    recompile-limit: a function hit a dynamo recompile limit (at any step, warm-up included): it
    runs eagerly, uncompiled, from then on."""
    sec = _dynamo(ctx)
    if sec is None:
        return []
    out = []
    in_measured = _measured_indices(ctx, sec)
    n_measured = len(ctx.profile.steps)
    groups: dict = {}
    for r in sec.recompiles:
        if in_measured(r.step_index):
            groups.setdefault((r.function, r.file, r.line), []).append(r)
    for (function, file, line), rs in groups.items():
        first = rs[0]
        where = first.where or (f"{file}:{line}" if file else "an unknown place")
        guards = list(dict.fromkeys(r.reason for r in rs if r.reason))
        guard = guards[0] if guards else "no guard failure given"
        steps = sorted({r.step_index for r in rs})
        times = [r.compile_s for r in rs if r.compile_s is not None]
        compile_s = sum(times) if times else None
        what = _function_words(first)
        because = (f"dynamo recompiled {what} at {where} {_times(len(rs))} during the measured steps "
                   f"(step{_s(len(steps))} {', '.join(str(s) for s in steps)}); the failed guard: {guard}")
        if len(guards) > 1:
            because += f"; also: {'; '.join(guards[1:3])}"
        if compile_s is not None:
            because += (f"; those recompilations took {seconds(compile_s)}, "
                        f"{seconds(compile_s / max(n_measured, 1))} per measured step over {n_measured}")
        note = ("not estimated: the recompilations' time is in the measured steps that had them, but the "
                "typical step need not include them, and whether they recur in a longer run depends on how "
                "often the guarded value changes")
        out.append(Finding(
            id="recompile",
            title=f"torch.compile recompiled {what} at {where} {_times(len(rs))} in the measured steps: {guard}",
            saving_s=None,
            evidence={"function": function, "file": file, "line": line, "recompiles": len(rs),
                      "step_indices": steps, "guards": guards[:5], "guard_kind": _guard_kind(guard),
                      "compile_s": compile_s, "measured_steps": n_measured,
                      **({"ceiling_s": compile_s / max(n_measured, 1),
                          "ceiling_what": "its recompilations' time over the measured steps"} if compile_s else {})},
            confidence="high", kind="fix", fix=_recompile_fix(first, guard), note=note, because=because,
        ))
    out.extend(_warmup_recompiles(sec, in_measured, ctx.profile.steps))
    for hit in sec.limit_hits:
        where = hit.where or (f"{hit.file}:{hit.line}" if hit.file else "an unknown place")
        resume = _RESUME.match(hit.function or "")
        code = Recompile(function=hit.function, user_code=True,
                         resume_of={"function": resume.group(1), "line": int(resume.group(2))} if resume else None)
        what = _function_words(code)
        limit = f"{hit.limit} ({hit.value})" if hit.value else (hit.limit or "its recompile limit")
        when = ("during the measured steps" if in_measured(hit.step_index)
                else f"in step {hit.step_index}" if hit.step_index is not None else "between steps")
        because = (f"dynamo hit {limit} for {what} at {where} {when}: after that many recompilations it "
                   "stops compiling it, and it runs eagerly")
        if hit.reason:
            because += f"; the last failed guard: {hit.reason}"
        out.append(Finding(
            id="recompile-limit",
            title=f"torch.compile gave up on {what} at {where}: {hit.limit or 'recompile limit'} hit, it runs eagerly",
            saving_s=None,
            evidence={"function": hit.function, "file": hit.file, "line": hit.line, "limit": hit.limit,
                      "value": hit.value, "last_guard": hit.reason, "step_index": hit.step_index},
            confidence="high", kind="fix",
            fix=(_recompile_fix(code, hit.reason) if hit.reason else
                 "find the guard that keeps failing (TORCH_LOGS=recompiles) and keep its value constant"),
            note=("not estimated: the compiled and eager speeds of this function were not both measured; "
                  "raising torch._dynamo.config.recompile_limit only hides the recompilations"),
            because=because,
        ))
    return out


# A guard on a module's hook dicts: a hook added to (or removed from) the model after it was
# compiled. gpuprof adds none to a compiled model (runners/script_state.py), so it is the script's.
_HOOK_GUARD = re.compile(r"_(?:forward|forward_pre|backward|backward_pre|state_dict)_hooks")


def _warmup_recompiles(sec: DynamoSection, in_measured, measured_steps=()) -> list[Finding]:
    """recompile-warmup: the recompilations outside the measured steps (the first steps compile,
    and a function called with another shape, mode or object compiles again), each function once
    with its guard, so a report of a compiled run names them; information, no saving (a one-time
    cost, inside compile warm-up's figure). A guard that keeps failing shows again in the measured
    steps as `recompile`."""
    # before the first measured step (the experiment steps after the measured ones are not warm-up)
    first = min((s.index for s in measured_steps), default=None)
    early = [r for r in sec.recompiles if not in_measured(r.step_index)
             and (first is None or r.step_index is None or r.step_index < first)]
    if not early:
        return []
    groups: dict = {}
    for r in early:
        groups.setdefault((r.function, r.file, r.line), []).append(r)
    parts = []
    for rs in groups.values():
        first = rs[0]
        where = first.where or (f"{first.file}:{first.line}" if first.file else "an unknown place")
        parts.append(f"{_function_words(first)} at {where} {_times(len(rs))}: {first.reason or 'no guard given'}")
    times_ = [r.compile_s for r in early if r.compile_s is not None]
    spent = f", {seconds(sum(times_))} of compiling" if times_ else ""
    hooks = [r for r in early if r.reason and _HOOK_GUARD.search(r.reason)]
    note = "a one-time cost of the first steps, inside the compile warm-up; not in the measured steps"
    if hooks:
        note = join_notes(note, f"{len(hooks)} of them failed a guard on a module's hooks: a hook was added to or "
                                "removed from the compiled model after it was compiled (gpuprof adds none to a "
                                "compiled model), and each change of its hooks compiles it again")
    return [Finding(
        id="recompile-warmup", kind="info", saving_s=None, confidence="high",
        title=(f"torch.compile recompiled {len(groups)} function{_s(len(groups))} {_times(len(early))} "
               f"before the measured steps{spent}"),
        evidence={"recompiles": len(early), "functions": len(groups), "compile_s": sum(times_) if times_ else None,
                  "hook_guards": len(hooks), "guards": [r.reason for r in early[:5]]},
        because="; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else ""),
        note=note,
    )]
