"""The step lines GPT training scripts print about themselves, summarised: plain data shared by
the script runner (which tees a script's output line by line) and the log analysis.

One line is read by gpuprof.steplog_formats (the formats, each from its project's own print
statement: nanoGPT, build-nanogpt, llm.c, HF Trainer, nanochat, modded-nanogpt, torchtitan,
litgpt); here, a run's lines: the step times a format prints only as a running total, which
lines' numbers cannot be a step's, which printed MFUs are claims, and `reported_summary`, the
script's own figures beside gpuprof's step (measurements.script.reported).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from gpuprof.stats import median
from gpuprof.steplog_formats import FIRST_STEP, FORMATS, EvalLine, IterLine, StepLine, parse_line

__all__ = ["FIRST_STEP", "FORMATS", "EvalLine", "IterLine", "StepLine", "parse_line", "bad_numbers", "mfu_claim",
           "zero_mfu_note", "derive_step_times", "parse_lines", "main_format", "HF_NO_STEP_TIME", "NO_STEP_TIME",
           "reported_summary"]

# Formats that print an MFU of 0 when they know no peak for the device: nanochat divides by
# float('inf') on CPU and MPS and for a GPU missing from its table ("MFU will show as 0%").
ZERO_MFU_IS_NO_PEAK = frozenset({"nanochat"})


def zero_mfu_note(fmt: str) -> str:
    """Why a format's printed MFU of 0 is left out (ZERO_MFU_IS_NO_PEAK)."""
    return (f"{fmt} printed an MFU of 0: it does so where it knows no peak for the device (CPU, MPS, a GPU "
            "missing from its table), so it is no MFU claim")


def bad_numbers(rec: StepLine) -> str | None:
    """Why a step line's numbers cannot be a training step's (a step time that is not a positive
    finite number, an MFU or tokens/s that is not finite or is negative — nanoGPT's -100.00% MFU
    placeholder aside), else None. Such lines are skipped and counted, never averaged."""
    if rec.step_ms is not None and not (math.isfinite(rec.step_ms) and rec.step_ms > 0):
        return f"step time {rec.step_ms:g} ms"
    if rec.tokens_per_s is not None and not (math.isfinite(rec.tokens_per_s) and rec.tokens_per_s >= 0):
        return f"{rec.tokens_per_s:g} tokens/s"
    if rec.mfu_pct is not None and not (math.isfinite(rec.mfu_pct) and (rec.mfu_pct >= 0 or rec.mfu_pct == -100.0)):
        return f"MFU {rec.mfu_pct:g}%"
    return None  # a diverged (nan) loss is a real, printed value: the step time still counts


def mfu_claim(rec: StepLine) -> float | None:
    """The MFU a line claims, in %, or None where it prints a placeholder: nanoGPT's -100.00
    before its iter 5, nanochat's 0.00 for a device whose peak it does not know (a 0 is no ratio
    to check a measured MFU against, only "the script had no peak")."""
    m = rec.mfu_pct
    if m is None or m <= -99.0 or (m == 0 and rec.format in ZERO_MFU_IS_NO_PEAK):
        return None
    return m


def derive_step_times(records: list[StepLine]) -> list[StepLine]:
    """The records, with a step time where a line prints only its clock's running total
    (`elapsed_ms`, modded-nanogpt's train_time): the rise since the format's previous line ÷ the
    steps between them (one step's own time on consecutive lines; the script stops that clock for
    validation, so no eval is in it). The format's first line has one only at its FIRST_STEP
    (then the total is that step's time); a total that fell (copies of 2024 restart the clock at
    step 10) or stood still gives none. step_avg is not used: a running mean from step 1, it
    keeps the first steps' cost in every later figure. Records are new objects where changed."""
    out, last = [], {}
    for r in records:
        if r.elapsed_ms is not None and r.step is not None:
            prev = last.get(r.format)
            ms = None
            if prev is None:
                ms = r.elapsed_ms if r.step == FIRST_STEP.get(r.format) else None
            elif r.step > prev[0] and r.elapsed_ms > prev[1]:
                ms = (r.elapsed_ms - prev[1]) / (r.step - prev[0])
            last[r.format] = (r.step, r.elapsed_ms)
            if r.step_ms is None and ms is not None:
                r = replace(r, step_ms=ms)
        out.append(r)
    return out


def parse_lines(lines) -> tuple[list[StepLine], list[EvalLine]]:
    """(step lines, eval lines) of an iterable of printed lines, step times derived where a
    format prints only a running total (derive_step_times)."""
    steps, evals = [], []
    for line in lines:
        rec = parse_line(line)
        if isinstance(rec, StepLine):
            steps.append(rec)
        elif isinstance(rec, EvalLine):
            evals.append(rec)
    return derive_step_times(steps), evals


def main_format(records: list[StepLine]) -> str | None:
    """The format most step lines with a time are in (else most lines): the one to summarise."""
    timed = Counter(r.format for r in records if r.step_ms is not None)
    counts = timed or Counter(r.format for r in records)
    return counts.most_common(1)[0][0] if counts else None


HF_NO_STEP_TIME = ("HF Trainer prints a step time only as train_steps_per_second in its end-of-training "
                   "summary, which a run gpuprof stops never reaches (--no-stop lets it finish)")
# Why a format's lines give no step time (the summary's `note`).
NO_STEP_TIME = {
    "hf-trainer": HF_NO_STEP_TIME,
    "torchtitan": "torchtitan prints tokens/s per device (tps), averaged since its previous log line, and "
                  "no step time",
    "litgpt": "litgpt's iter time is one iteration's (a micro-batch); with gradient accumulation (iter ≠ step "
              "on its lines) that is not an optimizer step's time",
}


def reported_summary(records: list[StepLine], *, skip_first: int, gpuprof_step_s: float | None) -> dict:
    """What the script's own log says, beside gpuprof's step (measurements.script.reported).

    Lines of the main format only; the medians (step time, tokens/s, MFU) skip the first
    `skip_first` lines (the warmup) when more remain: the lines with a step time, else those with
    a tokens/s or an MFU (torchtitan). A whole-run average (HF) is used when no line has a step
    time of its own. MFU placeholders are left out (mfu_claim); `mfu_note` says why when every
    printed MFU was one. ratio = gpuprof's step ÷ the script's step (None if either is missing)."""
    records = [r for r in derive_step_times(records) if not bad_numbers(r)]
    fmt = main_format(records)
    mine = [r for r in records if r.format == fmt]
    per_step = [r for r in mine if r.step_ms is not None and not r.whole_run]
    whole = [r for r in mine if r.step_ms is not None and r.whole_run]
    counted = per_step or [r for r in mine if not r.whole_run and (r.tokens_per_s is not None or r.mfu_pct is not None)]
    skipped = skip_first if len(counted) > skip_first else 0
    settled = counted[skipped:]
    step_ms = source = None
    tps = [r.tokens_per_s for r in settled if r.tokens_per_s is not None]
    if per_step:
        step_ms, source = median(r.step_ms for r in settled), "step lines"
    elif whole:
        step_ms = whole[-1].step_ms
        source = "train_steps_per_second: an average over the whole run, startup included"
        tps = [r.tokens_per_s for r in whole[-1:] if r.tokens_per_s is not None]
    mfus = [m for m in map(mfu_claim, settled) if m is not None]
    out = {
        "format": fmt,
        "lines": len(mine),
        "step_ms_median": step_ms,
        "step_ms_source": source,
        "tokens_per_s_median": median(tps),
        "mfu_pct_median": median(mfus),
        "mfu_lines": len(mfus),
        "skipped_first": skipped,
        "ratio": gpuprof_step_s * 1e3 / step_ms if gpuprof_step_s and step_ms else None,
    }
    if step_ms is None and fmt in NO_STEP_TIME:
        out["note"] = NO_STEP_TIME[fmt]
    if fmt in ZERO_MFU_IS_NO_PEAK and not mfus and any(r.mfu_pct == 0 for r in settled):
        out["mfu_note"] = zero_mfu_note(fmt)
    others = Counter(r.format for r in records if r.format != fmt)
    if others:
        out["other_formats"] = dict(others)  # lines in another format, left out of the figures
    return out
