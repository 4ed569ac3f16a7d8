"""One printed line -> the step it reports (StepLine) or an eval (EvalLine): the step-line formats
of GPT training scripts, each read from its project's own print statement.

Formats (FORMATS), each a `StepLine` with the script's own step time where it prints one:
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
- nanochat       `step 00012/00040 (30.00%) | loss: 5.436076 | lrm: 0.80 | dt: 157.12ms | tok/sec:
                 13,041 | bf16_mfu: 41.23 | ...` (karpathy/nanochat scripts/base_train.py); MFU in %
                 without a % sign, 0.00 where nanochat knows no peak for the device
- modded-nanogpt `step:125/1750 train_time:12345ms step_avg:98.76ms` (KellerJordan/modded-nanogpt
                 train_gpt.py): no step time of its own, only the running total `elapsed_ms` that
                 gpuprof.steplog.derive_step_times turns into one
- torchtitan     `step: 10  loss:  7.1234  grad_norm: ...  memory: ...  tps: 1,234  tflops: 56.78
                 mfu: 12.34%` (pytorch/torchtitan torchtitan/components/metrics.py): tokens/s per
                 device, no step time
- litgpt         `Epoch 1 | iter 100 step 100 | loss train: 3.123, val: n/a | iter time: 120.34 ms
                 (step) remaining time: ...` (Lightning-AI/litgpt litgpt/pretrain.py): one
                 iteration's time, a step's only without gradient accumulation (iter == step)
ANSI colour codes are stripped and a `\\r`-joined progress line is read segment by segment.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass

FORMATS = ("nanogpt", "build-nanogpt", "llm.c", "hf-trainer", "nanochat", "modded-nanogpt", "torchtitan", "litgpt")
# The step number of a run's first line, per format: that line holds compilation and the first
# eval (nanoGPT's iter 0, build-nanogpt's and nanochat's step 0; llm.c and modded-nanogpt print
# step+1; torchtitan logs step 1 whatever its log_freq; litgpt counts from 1).
FIRST_STEP = {"nanogpt": 0, "build-nanogpt": 0, "llm.c": 1, "nanochat": 0, "modded-nanogpt": 1,
              "torchtitan": 1, "litgpt": 1}

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
# nanochat, scripts/base_train.py: print0(f"step {step:05d}/{num_iterations:05d} ({pct_done:.2f}%) |
#   loss: {debiased_smooth_loss:.6f} | lrm: {lrm:.2f} | dt: {dt * 1000:.2f}ms | tok/sec: {tok_per_sec:,} |
#   bf16_mfu: {mfu:.2f} | epoch: {epoch} | total time: {total_training_time/60:.2f}m{eta_str}")
# (earlier: `mfu: {mfu:.2f}`, ` grad norm: {g:.4f} |` after the loss); scripts/chat_sft.py and
# mid_train.py print `step {step:05d} ({pct_done:.2f}%) | loss: ...`, no total. The `(P%)` sets it
# apart from build-nanogpt's `step N | loss:` and llm.c's `step N/M | loss L`; `dt: T ms` required.
NANOCHAT_RE = re.compile(
    rf"\bstep\s+(?P<step>\d+)(?:\s*/\s*\d+)?\s*\(\s*{_NUM}\s*%\s*\)\s*\|\s*loss\s*:\s*(?P<loss>{_LOSS})")
# mfu = 100 * flops_per_sec / (gpu_peak_flops * ddp_world_size): a percent, printed without a
# % sign (`bf16_mfu: 41.23`; `fp8_mfu`, `mfu`, a trailing % accepted).
NANOCHAT_MFU_RE = re.compile(rf"\b(?:(?:bf16|fp8)_)?mfu\s*:\s*(?P<mfu>{_NUM})(?![\d.])\s*%?", re.I)
# modded-nanogpt, train_gpt.py: print0(f"step:{step+1}/{train_steps} train_time:{approx_training_time_ms:.0f}ms
#   step_avg:{approx_training_time_ms/(step + 1):.2f}ms", console=True)  (2024 copies: `train_loss:{L:.4f}`
# after the step, step_avg `nan` before step 11). train_time is the clock's running total, stopped
# during validation; its val line `step:N/M val_loss:L train_time:...` is an eval line.
MODDED_RE = re.compile(
    rf"\bstep:(?P<step>\d+)/\d+\s+(?:train_loss:(?P<loss>{_LOSS})\s+)?train_time:(?P<elapsed>{_NUM})ms")
# torchtitan, torchtitan/components/metrics.py MetricsProcessor.log: logger.info(f"{color.red}step:
#   {step:2}  {color.green}loss: {global_avg_loss:8.5f}  {color.orange}grad_norm: {grad_norm:7.4f}  ...
#   memory: {gib:5.2f}GiB({pct:.2f}%)  {color.blue}tps: {round(tps):,}  {color.cyan}tflops: {tflops:,.2f}
#   {color.magenta}mfu: {mfu_str}{color.reset}")  -- mfu_str `N/A` under FP8/MX quantization; train.py
# of 2024 printed `wps: {round(wps):,}` instead of tps. Its eval line starts `validate step:`.
TITAN_RE = re.compile(rf"\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_LOSS})\s")
TITAN_TPS_RE = re.compile(rf"\b[tw]ps:\s*(?P<tps>{_NUM})")
# litgpt, litgpt/pretrain.py fit(): fabric.print(f"Epoch {metrics['epoch'] + 1} | iter {metrics['iter']}
#   step {metrics['step']} | loss train: {metrics['loss']:.3f}, val: {val_loss} | iter time:
#   {metrics['iter_time'] * 1000:.2f} ms{' (step)' if not is_accumulating else ''} remaining time: ...")
# and before it `iter {iter_num} step {step_count}: loss {loss:.4f}, iter time: {ms:.2f}ms
# (optimizer.step)` (also `iter N | step S:`, `train time:`). Its eval line `iter N: val loss ...`.
LITGPT_RE = re.compile(
    rf"\biter\s+(?P<iter>\d+)\s*\|?\s*step\s+(?P<step>\d+)\s*[:|]\s*loss(?:\s+train)?\s*:?\s*(?P<loss>{_LOSS})")
LITGPT_MS_RE = re.compile(rf"\b(?:iter|train)\s+time\s*:\s*(?P<ms>{_NUM})\s*ms", re.I)
LITGPT_STEP_RE = re.compile(r"\((?:optimizer\.)?step\)")
# An evaluation line is not a step line, whatever else it holds.
_NOT_A_STEP_RE = re.compile(r"\b(?:val(?:idation)?|eval|test)[\s_]*loss|\bvalidate\s+step", re.I)
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A value an HF log dict may print wrapped: np.float64(1.2), tensor(1.2, device='cuda:0').
_WRAPPED_RE = re.compile(rf"\b[A-Za-z_][\w.]*\(\s*(?P<v>{_LOSS})\s*(?:,[^()]*)?\)")
_HF_MAX_CHARS = 20_000  # a longer "dict" is no Trainer log: not worth parsing


@dataclass
class StepLine:
    """One step line a script printed. `whole_run`: step_ms is an average over the whole run
    (HF Trainer's 1/train_steps_per_second), not one step's time. `elapsed_ms`: the script's
    running total of training time at this step (modded-nanogpt's train_time), where it prints
    that instead of a step time."""

    format: str
    step: int | None
    loss: float | None
    step_ms: float | None
    tokens_per_s: float | None = None
    mfu_pct: float | None = None  # as printed: nanoGPT prints -100.00 before its iter 5
    whole_run: bool = False
    elapsed_ms: float | None = None

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("format", "step", "loss", "step_ms", "tokens_per_s", "mfu_pct")}
        if self.whole_run:
            d["whole_run"] = True
        if self.elapsed_ms is not None:
            d["elapsed_ms"] = self.elapsed_ms
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


def _found(regex: re.Pattern, text: str, group: str) -> float | None:
    m = regex.search(text)
    return _f(m.group(group)) if m else None


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
    return StepLine("build-nanogpt", int(m.group("step")), _f(m.group("loss")), _ms(dt.group("dt"), dt.group("unit")),
                    tokens_per_s=_found(BUILD_TOK_RE, rest, "tps"), mfu_pct=_mfu(rest))


def _llmc(text: str) -> StepLine | None:
    m = LLMC_RE.search(text)
    if not m:
        return None
    rest = text[m.end():]
    ms = LLMC_MS_RE.search(rest)
    if not ms:
        return None
    return StepLine("llm.c", int(m.group("step")), _f(m.group("loss")), _f(ms.group("ms")),
                    tokens_per_s=_found(LLMC_TOK_RE, rest, "tps"), mfu_pct=_mfu(rest))


def _nanochat(text: str) -> StepLine | None:
    m = NANOCHAT_RE.search(text) if "%)" in text else None
    if not m:
        return None
    rest = text[m.end():]
    dt = BUILD_DT_RE.search(rest)
    if not dt:
        return None
    return StepLine("nanochat", int(m.group("step")), _f(m.group("loss")), _ms(dt.group("dt"), dt.group("unit")),
                    tokens_per_s=_found(BUILD_TOK_RE, rest, "tps"), mfu_pct=_found(NANOCHAT_MFU_RE, rest, "mfu"))


def _modded_nanogpt(text: str) -> StepLine | None:
    m = MODDED_RE.search(text) if "train_time:" in text else None
    if not m:
        return None
    loss = m.group("loss")
    return StepLine("modded-nanogpt", int(m.group("step")), _f(loss) if loss else None, None,
                    elapsed_ms=_f(m.group("elapsed")))


def _torchtitan(text: str) -> StepLine | None:
    m = TITAN_RE.search(text) if "step:" in text else None
    if not m:
        return None
    rest = text[m.end():]
    tps = _found(TITAN_TPS_RE, rest, "tps")
    if tps is None:
        return None
    return StepLine("torchtitan", int(m.group("step")), _f(m.group("loss")), None, tokens_per_s=tps,
                    mfu_pct=_mfu(rest))


def _litgpt(text: str) -> StepLine | None:
    m = LITGPT_RE.search(text)
    if not m:
        return None
    rest = text[m.end():]
    ms = LITGPT_MS_RE.search(rest)
    if not ms:
        return None
    # `iter time` times one iteration (one micro-batch, and the optimizer step when marked): a
    # step's time only when every iteration is a step (no gradient accumulation: iter == step).
    whole_step = LITGPT_STEP_RE.search(rest) and m.group("iter") == m.group("step")
    return StepLine("litgpt", int(m.group("step")), _f(m.group("loss")), _f(ms.group("ms")) if whole_step else None)


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
    # The formats' patterns exclude one another (tests/script/test_step_formats.py): order is speed.
    return (_llmc(text) or _build_nanogpt(text) or _nanochat(text) or _modded_nanogpt(text)
            or _torchtitan(text) or (_litgpt(text) if "iter" in low else None))


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
