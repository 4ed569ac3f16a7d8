"""The step lines GPT training scripts print about themselves, parsed: plain data shared by the
script runner (which tees a script's output line by line) and the log analysis.

Formats (FORMATS), each a `StepLine` with the script's own step time:
- nanogpt        `iter 12: loss 4.1234, time 123.45ms, mfu 12.34%` (karpathy/nanoGPT train.py);
                 its eval line `step 0: train loss 4.1, val loss 4.2` is an `EvalLine`
- build-nanogpt  `step    12 | loss: 4.123456 | lr 6.0000e-04 | norm: 1.2345 | dt: 123.45ms |
                 tok/sec: 12345.67` (karpathy/build-nanogpt train_gpt2.py)
- llm.c          `step 12/100 | train loss 4.1234 | norm 1.2345 | lr 6.00e-04 | (123.45 ms |
                 12345 tok/s)` (train_gpt2.py), and train_gpt2.cu's `step 12/100 | loss 4.12 (+0.1z)|
                 ... | 123.45 ms | 45.6% bf16 MFU | 12345 tok/s`
- hf-trainer     Hugging Face Trainer's printed log dicts: `{'loss': 2.31, 'learning_rate': 5e-05,
                 'epoch': 0.12}` per logging step (no time), and the final `{'train_runtime': 12.3,
                 ..., 'train_steps_per_second': 1.6, ...}`, whose 1/steps-per-second is a whole-run
                 average (`whole_run`), the only step time the Trainer prints.
ANSI colour codes are stripped and a `\\r`-joined progress line is read segment by segment.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from dataclasses import dataclass

from gpuprof.stats import median

FORMATS = ("nanogpt", "build-nanogpt", "llm.c", "hf-trainer")
# The step number of a run's first line, per format: that line holds compilation and the first
# eval (nanoGPT's iter 0, build-nanogpt's step 0; llm.c prints step+1).
FIRST_STEP = {"nanogpt": 0, "build-nanogpt": 0, "llm.c": 1}

# A number as scripts print it: 123, 123.45, 1.2e-04, .5, with thousands separators (12,345.67).
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_LOSS = r"(?:[-+]?(?i:nan|inf(?:inity)?)|" + _NUM + r")"

# iter 10: loss 4.2345, time 21000.12ms, mfu 104.33%   (anything may follow)
ITER_RE = re.compile(
    rf"\biter\s+(?P<iter>\d+)\s*:\s*loss\s+(?P<loss>{_LOSS})\s*,\s*time\s+(?P<ms>{_NUM})\s*ms"
    rf"(?:\s*,\s*mfu\s+(?P<mfu>{_NUM})\s*%)?"
)
# step 0: train loss 10.9876, val loss 10.9912   (nanoGPT's eval line)
EVAL_RE = re.compile(
    rf"\bstep\s+(?P<step>\d+)\s*:\s*train loss\s+(?P<train>{_LOSS})\s*,\s*val loss\s+(?P<val>{_LOSS})"
)
# build-nanogpt: `step N |` (or `step N,`) then `loss: L`; the fields after are searched one by
# one (their order and extra fields vary between copies), `dt: T ms` required.
BUILD_RE = re.compile(rf"\bstep\s+(?P<step>\d+)\s*[|,]\s*loss\s*:?\s*(?P<loss>{_LOSS})", re.I)
BUILD_DT_RE = re.compile(rf"\bdt\s*[:=]?\s*(?P<dt>{_NUM})\s*(?P<unit>ms|s)\b", re.I)
BUILD_TOK_RE = re.compile(rf"\btok(?:ens)?/s(?:ec)?\s*[:=]?\s*(?P<tps>{_NUM})", re.I)
# llm.c: `step N/M |` (or `step N/M:`) then `train loss L` / `loss L`; `T ms` required.
LLMC_RE = re.compile(rf"\bstep\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*[|:]\s*(?:train\s+)?loss\s+(?P<loss>{_LOSS})",
                     re.I)
LLMC_MS_RE = re.compile(rf"(?<![\w.])(?P<ms>{_NUM})\s*ms\b", re.I)
LLMC_TOK_RE = re.compile(rf"(?<![\w.])(?P<tps>{_NUM})\s*tok(?:ens)?/s\b", re.I)
MFU_RE = re.compile(rf"\bmfu\s*[:=]?\s*(?P<mfu>{_NUM})\s*%|(?<![\w.])(?P<mfu2>{_NUM})\s*%\s*(?:\w+\s+)?mfu\b", re.I)
# An evaluation line is not a step line, whatever else it holds.
_NOT_A_STEP_RE = re.compile(r"\b(?:val(?:idation)?|eval|test)[\s_]*loss", re.I)
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A value an HF log dict may print wrapped: np.float64(1.2), tensor(1.2, device='cuda:0').
_WRAPPED_RE = re.compile(rf"\b[A-Za-z_][\w.]*\(\s*(?P<v>{_LOSS})\s*(?:,[^()]*)?\)")
_HF_MAX_CHARS = 20_000  # a longer "dict" is no Trainer log: not worth parsing


@dataclass
class StepLine:
    """One step line a script printed. `whole_run`: step_ms is an average over the whole run
    (HF Trainer's 1/train_steps_per_second), not one step's time."""

    format: str
    step: int | None
    loss: float | None
    step_ms: float | None
    tokens_per_s: float | None = None
    mfu_pct: float | None = None  # as printed: nanoGPT prints -100.00 before its iter 5
    whole_run: bool = False

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("format", "step", "loss", "step_ms", "tokens_per_s", "mfu_pct")}
        if self.whole_run:
            d["whole_run"] = True
        return d


IterLine = StepLine  # the former name (nanoGPT `iter` lines only), kept for its importers


@dataclass
class EvalLine:
    step: int
    train_loss: float
    val_loss: float


def _f(s: str) -> float:
    return float(s.replace(",", ""))


def _ms(value: str, unit: str) -> float:
    return _f(value) * (1e3 if unit.lower() == "s" else 1.0)


def _mfu(text: str) -> float | None:
    m = MFU_RE.search(text)
    return _f(m.group("mfu") or m.group("mfu2")) if m else None


def _nanogpt(m: re.Match) -> StepLine:
    mfu = m.group("mfu")
    return StepLine("nanogpt", int(m.group("iter")), _f(m.group("loss")), _f(m.group("ms")),
                    mfu_pct=_f(mfu) if mfu is not None else None)


def _build_nanogpt(text: str) -> StepLine | None:
    m = BUILD_RE.search(text)
    if not m:
        return None
    rest = text[m.end():]
    dt = BUILD_DT_RE.search(rest)
    if not dt:
        return None
    tok = BUILD_TOK_RE.search(rest)
    return StepLine("build-nanogpt", int(m.group("step")), _f(m.group("loss")), _ms(dt.group("dt"), dt.group("unit")),
                    tokens_per_s=_f(tok.group("tps")) if tok else None, mfu_pct=_mfu(rest))


def _llmc(text: str) -> StepLine | None:
    m = LLMC_RE.search(text)
    if not m:
        return None
    rest = text[m.end():]
    ms = LLMC_MS_RE.search(rest)
    if not ms:
        return None
    tok = LLMC_TOK_RE.search(rest)
    return StepLine("llm.c", int(m.group("step")), _f(m.group("loss")), _f(ms.group("ms")),
                    tokens_per_s=_f(tok.group("tps")) if tok else None, mfu_pct=_mfu(rest))


def _literal_dict(text: str) -> dict | None:
    """A printed dict, read as data (never eval): Python repr (single quotes) or JSON (double
    quotes, true/null/NaN); values printed wrapped (np.float64(x), tensor(x, ...)) unwrapped."""
    for attempt in (ast.literal_eval, json.loads):
        try:
            d = attempt(text)
            return d if isinstance(d, dict) else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    cleaned = _WRAPPED_RE.sub(lambda m: m.group("v"), text)
    for word, literal in (("nan", "None"), ("NaN", "None"), ("null", "None"), ("inf", "1e999"),
                          ("Infinity", "1e999"), ("true", "True"), ("false", "False")):
        cleaned = re.sub(rf"(?<![\w'\"]){word}\b", literal, cleaned)
    try:
        d = ast.literal_eval(cleaned)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return d if isinstance(d, dict) else None


def _number(v) -> float | None:
    """A number, or a number printed as a string (transformers >= 5 logs f"{v:.4g}")."""
    if isinstance(v, str) and re.fullmatch(_LOSS, v.strip()):
        return _f(v.strip())
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _half_unit(v, rounded_to: float) -> float:
    """Half the last digit a value was printed with: from the string itself (f"{v:.4g}"), else
    half of `rounded_to` (the round(x, n) older transformers applied to floats)."""
    if isinstance(v, str):
        mant, _, exp = v.strip().lower().partition("e")
        decimals = len(mant.partition(".")[2])
        return 0.5 * 10.0 ** (-decimals + (int(exp) if exp else 0))
    return rounded_to / 2


def _hf_step_ms(d: dict) -> float | None:
    """ms per step from the Trainer's summary: 1/train_steps_per_second, or train_runtime over the
    step count when exactly one whole count fits the printed figures (both are rounded) and
    train_runtime is the more precise of the two."""
    raw_sps, raw_rt = d.get("train_steps_per_second"), d.get("train_runtime")
    sps, rt = _number(raw_sps), _number(raw_rt)
    if not sps or sps <= 0 or not math.isfinite(sps):
        return None
    dsps = _half_unit(raw_sps, 1e-3)  # speed_metrics: round(steps / runtime, 3)
    best, best_err = 1e3 / sps, dsps / sps
    if rt and rt > 0 and math.isfinite(rt):
        drt = _half_unit(raw_rt, 1e-4)  # round(runtime, 4)
        lo, hi = (sps - dsps) * (rt - drt), (sps + dsps) * (rt + drt)
        n = math.ceil(lo)
        if n >= 1 and n <= hi and math.floor(hi) == n and drt / rt < best_err:
            best = rt * 1e3 / n
    return best


def _hf_trainer(text: str) -> StepLine | None:
    if not (text.startswith("{") and text.endswith("}")) or len(text) > _HF_MAX_CHARS:
        return None
    if "loss" not in text and "train_runtime" not in text and "train_steps_per_second" not in text:
        return None
    d = _literal_dict(text)
    if not d or any(str(k).startswith(("eval_", "test_")) for k in d):  # an evaluation's dict
        return None
    step = d.get("step") if isinstance(d.get("step"), int) and not isinstance(d.get("step"), bool) else None
    if "train_steps_per_second" in d or "train_runtime" in d:
        return StepLine("hf-trainer", step, _number(d.get("train_loss")), _hf_step_ms(d),
                        tokens_per_s=_number(d.get("train_tokens_per_second")), whole_run=True)
    # A per-logging-step dict: a numeric loss beside the Trainer's own keys (not a user's dict).
    loss = d.get("loss", "missing")
    if loss is None:  # printed as nan
        loss = float("nan")
    if _number(loss) is None or not ({"learning_rate", "epoch", "grad_norm"} & set(d)):
        return None
    return StepLine("hf-trainer", step, float(loss), None)


def _parse_segment(text: str) -> StepLine | EvalLine | None:
    text = text.strip()
    if not text:
        return None
    if text[0] == "{":
        return _hf_trainer(text)
    low = text.lower()
    if "iter" in low:
        m = ITER_RE.search(text)
        if m:
            return _nanogpt(m)
    if "step" not in low:
        return None
    m = EVAL_RE.search(text)
    if m:
        return EvalLine(int(m.group("step")), _f(m.group("train")), _f(m.group("val")))
    if _NOT_A_STEP_RE.search(text):
        return None
    return _llmc(text) or _build_nanogpt(text)


def parse_line(line: str) -> StepLine | EvalLine | None:
    """One printed line -> StepLine / EvalLine, or None if it is neither. ANSI colour codes are
    ignored; a line holding `\\r`-separated progress updates is read from its last segment back."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if "\r" not in line:
        return _parse_segment(line)
    for seg in reversed(line.split("\r")):
        rec = _parse_segment(seg)
        if rec is not None:
            return rec
    return None


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


def parse_lines(lines) -> tuple[list[StepLine], list[EvalLine]]:
    """(step lines, eval lines) of an iterable of printed lines."""
    steps, evals = [], []
    for line in lines:
        rec = parse_line(line)
        if isinstance(rec, StepLine):
            steps.append(rec)
        elif isinstance(rec, EvalLine):
            evals.append(rec)
    return steps, evals


def main_format(records: list[StepLine]) -> str | None:
    """The format most step lines with a time are in (else most lines): the one to summarise."""
    timed = Counter(r.format for r in records if r.step_ms is not None)
    counts = timed or Counter(r.format for r in records)
    return counts.most_common(1)[0][0] if counts else None


HF_NO_STEP_TIME = ("HF Trainer prints a step time only as train_steps_per_second in its end-of-training "
                   "summary, which a run gpuprof stops never reaches (--no-stop lets it finish)")


def reported_summary(records: list[StepLine], *, skip_first: int, gpuprof_step_s: float | None) -> dict:
    """What the script's own log says, beside gpuprof's step (measurements.script.reported).

    Lines of the main format only; the median step time skips the first `skip_first` timed
    lines (the warmup) when more remain; a whole-run average (HF) is used when no line has a
    step time of its own. ratio = gpuprof's step ÷ the script's step (None if either is missing)."""
    records = [r for r in records if not bad_numbers(r)]
    fmt = main_format(records)
    mine = [r for r in records if r.format == fmt]
    per_step = [r for r in mine if r.step_ms is not None and not r.whole_run]
    whole = [r for r in mine if r.step_ms is not None and r.whole_run]
    skipped = skip_first if len(per_step) > skip_first else 0
    settled = per_step[skipped:]
    step_ms = source = note = None
    tps = [r.tokens_per_s for r in settled if r.tokens_per_s is not None]
    if settled:
        step_ms, source = median(r.step_ms for r in settled), "step lines"
    elif whole:
        step_ms = whole[-1].step_ms
        source = "train_steps_per_second: an average over the whole run, startup included"
        tps = [r.tokens_per_s for r in whole[-1:] if r.tokens_per_s is not None]
    elif fmt == "hf-trainer":
        note = HF_NO_STEP_TIME
    # nanoGPT prints mfu -100.00% until local_iter_num >= 5: a placeholder, not a measurement.
    mfus = [r.mfu_pct for r in mine if r.mfu_pct is not None and r.mfu_pct > -99.0]
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
    if note:
        out["note"] = note
    others = Counter(r.format for r in records if r.format != fmt)
    if others:
        out["other_formats"] = dict(others)  # lines in another format, left out of the figures
    return out
